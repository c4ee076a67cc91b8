// ps_bench's key-batch sections (bench/ps_bench_batches.cc), each measured
// beside raw ZeroMQ moving the same bytes in the same run:
//   SparseSection  sparse batches: uniform and Zipf keys, widths, 1 and 2
//                  servers, push and pull in keys per second
//   KeyedSection   one batch of millions of sorted keys of one float on a
//                  dense table, push (sgd) and pull, in milliseconds
//   SmallSection   4-byte pulls: p50 one at a time, and pulls per second
//                  with 8 and 64 in flight
// Every loop is bounded in count and in time; progress goes to stderr,
// tables to stdout.
#ifndef DOWNPOUR_BENCH_PS_BENCH_SECTIONS_H_
#define DOWNPOUR_BENCH_PS_BENCH_SECTIONS_H_

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "client/client.h"
#include "launch/local_cluster.h"

namespace downpour {
namespace bench {

// What every section needs from ps_bench's main.
struct SectionEnv {
  std::string raw_endpoint;  // the raw ZeroMQ peer (bench/raw_zmq.h)
  int raw_pid = -1;          // its process
  double seconds = 2;        // time budget of one measurement
  int rounds = 1;            // raw and Downpour alternated this many times
  std::vector<int> servers = {1, 2};  // server counts to measure
  // Starts a local cluster of `servers` servers, logs under `tag`.
  std::function<std::unique_ptr<LocalCluster>(int servers,
                                              const std::string& tag)>
      start;
  std::function<std::unique_ptr<Client>(const LocalCluster&)> connect;
  // The same with ClientOptions::spin_wait = 0: a Wait sleeps at once.
  std::function<std::unique_ptr<Client>(const LocalCluster&)> connect_sleeping;
};

struct SparseOptions {
  std::vector<std::string> dists = {"uniform", "zipf"};
  std::vector<int> widths = {8, 64};
  size_t batch = 100'000;         // keys a batch (repeats allowed)
  uint64_t distinct = 1'000'000;  // rows of the table
  int max_batches = 40;           // per measurement
  // The same batches to a dense table of `distinct` rows (keys 0, 1, ...):
  // the path around the row store with a store that costs an array index.
  bool dense = false;
  // Of "push", "pull" and "summed" (a push to a table that sums repeats).
  std::vector<std::string> modes = {"push", "pull", "summed"};
};
void SparseSection(const SectionEnv& env, const SparseOptions& options);

struct KeyedOptions {
  uint64_t keys = 10'000'000;
  // Key i of the batch is i * stride: 1 is every key of the table, 2 every
  // other one (sorted, not contiguous).
  std::vector<int> strides = {1, 2};
  int reps = 3;  // per operation and round; the median is reported
};
void KeyedSection(const SectionEnv& env, const KeyedOptions& options);

struct SmallOptions {
  // > 0: only `count` pulls with 64 in flight, through Downpour or (raw)
  // raw ZeroMQ, and their wall time; for counting what a request costs
  // (perf stat -e raw_syscalls:sys_enter,context-switches -- ps_bench ...)
  // at two counts, so that start-up cancels out.
  int count = 0;
  bool raw = false;
};
void SmallSection(const SectionEnv& env, const SmallOptions& options = {});

}  // namespace bench
}  // namespace downpour

#endif  // DOWNPOUR_BENCH_PS_BENCH_SECTIONS_H_
