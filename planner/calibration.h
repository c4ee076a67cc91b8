// What `psctl calibrate` measured on a cluster, the planner's other input:
// a worker's compute rates (the model's layer products at its batch size, a
// large GEMM, memory bandwidth, how many cores the host really gives), the
// data plane's latency, bandwidth and CPU cost per request and per byte on
// the client and on a server, and a server's apply cost per handler. Every
// figure that was sampled keeps its spread (median, 10th and 90th
// percentile over the rounds). Saved as JSON (CalibrationToJson).
//
// The file records where it was measured (ClusterIdentity); CheckCluster
// refuses a calibration from another cluster with kFailedPrecondition
// naming the file and the field that differs.
//
// ReadCalibration's errors name the file and the field: kNotFound (no
// file), kInvalidArgument (not JSON, a field missing, misspelt or out of
// range), kFailedPrecondition (another format_version).
#ifndef DOWNPOUR_PLANNER_CALIBRATION_H_
#define DOWNPOUR_PLANNER_CALIBRATION_H_

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "planner/json.h"

namespace downpour {
namespace planner {

inline constexpr int64_t kCalibrationFormat = 1;

// A sampled figure: the median and the 10th / 90th percentiles of
// `samples` samples (timed calls or rounds). The model reads a rate's p90
// and a cost's p10: what a core gives when it is ours. On a host shared
// with other work, slower samples are calls that other processes cut into,
// and that share of the host is what `effective_cores` measures, so it must
// not be counted twice.
struct Spread {
  double median = 0;
  double p10 = 0;
  double p90 = 0;
  int64_t samples = 0;
};
// The spread of `samples` (empty: all zero).
Spread SpreadOf(std::vector<double> samples);

struct ClusterIdentity {
  std::string host;       // the calibrating host's name
  std::string cpu_model;  // /proc/cpuinfo's "model name"
  int64_t cores = 0;      // CPUs the calibrating process may run on
  std::string scheduler;  // the live cluster's HOST:PORT, or "local"
};
// This host's name, CPU model and usable cores (scheduler left empty).
ClusterIdentity ThisHost();

// One fully connected layer's three products at one batch size, as the
// worker computes them (Eigen, row-major, one thread): forward (batch x in)
// (in x out), weight gradient (in x batch)(batch x out), input gradient
// (batch x out)(out x in).
struct LayerRate {
  int64_t batch = 0, in = 0, out = 0;
  Spread fwd_gflops, wgrad_gflops, dgrad_gflops;
};

// A whole step of a dense model as ps_worker computes it (the MLP code of
// models/: loss and gradient of a mini-batch, element-wise passes, the
// batch's gather, the gradient streamed as it is done), in milliseconds.
struct StepTime {
  int64_t batch = 0;
  std::vector<int64_t> layer_sizes;
  Spread ms;
  // The same step with its gradient's parts sent to a server as the
  // backward pass finishes them (ps_worker's BSP loop), to the end of the
  // backward pass; samples == 0: not measured. Recorded, not used by the
  // model (the CPU below is).
  Spread streamed_ms;
  // The CPU that streamed step costs, replies included, per step: of the
  // worker's process (its compute, its client's calls and I/O threads) and
  // of the server (one rank, each part applied at once with sgd); 0: not
  // measured. The model takes BSP's data-plane CPU from them
  // (docs/ARCHITECTURE.md, "The equations").
  double streamed_cpu_ms = 0;
  double streamed_server_cpu_ms = 0;
};

struct ComputeCalibration {
  Spread gemm_peak_gflops;  // a 512 x 512 x 512 product, one thread
  Spread memory_gbs;        // copying 64 MiB: bytes read + written per second
  // For k busy threads (k = 1, 2, 4, ...): their aggregate GEMM rate over
  // the rate of one thread that has a core to itself, i.e. the cores the
  // host gives k threads, other users' load included (below 1 on a busy
  // host; more threads get a larger share of it).
  std::vector<std::pair<int64_t, double>> effective_cores;
  // Relative spread of one step's compute: (median - p10) / 1.2816 over
  // p10 of the step's time (the faster half, as a normal's sigma; steps
  // that other processes cut into count in effective_cores instead).
  double step_cv = 0;
  std::vector<LayerRate> layers;
  std::vector<StepTime> steps;

  // The cores given to `threads` busy threads, interpolated between the
  // measured counts (proportional below the first, flat beyond the last);
  // `threads` itself when nothing was measured.
  double EffectiveCores(double threads) const;
  // The rates measured for this layer shape, or nullptr.
  const LayerRate* FindLayer(int64_t batch, int64_t in, int64_t out) const;
  // The step measured for this model, or nullptr.
  const StepTime* FindStep(int64_t batch,
                           const std::vector<int64_t>& layer_sizes) const;
};

struct NetworkCalibration {
  Spread latency_us;               // a 4-byte pull's round trip, one at a time
  int64_t message_bytes = 0;       // the large messages of the rates below
  int64_t in_flight = 0;           // k, for the *_k rates
  Spread push_gbs_1, pull_gbs_1;   // one in flight
  Spread push_gbs_k, pull_gbs_k;   // k in flight
  double small_pulls_per_s_k = 0;  // 4-byte pulls per second, k in flight
  // CPU time per request and per byte of payload, in the client process
  // and in one server process (the server's apply of the push excluded:
  // see apply_ns_per_float).
  double client_us_per_request = 0;
  double client_ns_per_push_byte = 0;
  double client_ns_per_pull_byte = 0;
  double server_us_per_request = 0;
  double server_ns_per_push_byte = 0;
  double server_ns_per_pull_byte = 0;
  // What a BSP request costs the server beyond one applied at once: held
  // until the step's other workers sent theirs, summed, answered later.
  double server_us_per_held_request = 0;
  // Of the server's CPU per request and per byte above, the share of its
  // busiest thread (the data thread, which serves requests one after
  // another; its I/O threads overlap with it). 1 when not measured.
  double server_serial_fraction = 1;
  // Of the client's CPU, what the calling thread (a worker's training loop)
  // spends itself, per request and per byte: on a worker's critical path.
  double caller_us_per_request = 0;
  double caller_ns_per_byte = 0;
  // "measured" (the server's CPU time, read from /proc) or "estimated"
  // (a live cluster whose servers run elsewhere: from the time per request
  // at k in flight, an upper bound).
  std::string server_cpu_source;
  // A small control-plane call (gRPC, to the scheduler), as every worker
  // step makes one to report its clock: CPU in the caller's process and in
  // the scheduler ("estimated" as the caller's when the scheduler runs
  // elsewhere), and its round trip.
  double control_client_us = 0;
  double control_scheduler_us = 0;
  double control_latency_us = 0;
};

struct Calibration {
  int64_t format_version = kCalibrationFormat;
  std::string created;  // UTC, RFC 3339
  ClusterIdentity cluster;
  ComputeCalibration compute;
  NetworkCalibration network;
  // A server's update cost per float pushed, per handler ("sum" is also
  // what BSP's aggregation of N gradients costs per float).
  std::map<std::string, Spread> apply_ns_per_float;
};

absl::StatusOr<Calibration> ReadCalibration(const std::string& path);
// `where` names the source in errors ("calibration file 'c.json'").
absl::StatusOr<Calibration> ParseCalibration(absl::string_view text,
                                             const std::string& where);
Json CalibrationToJson(const Calibration& c);
// Writes the JSON to `path` (through a temporary file renamed into place).
absl::Status WriteCalibration(const std::string& path, const Calibration& c);

// Whether `c` was measured on the cluster being planned for: with a
// non-empty `scheduler`, the scheduler address must match; otherwise
// `here`'s host, CPU model and cores must. kFailedPrecondition "<where>:
// field 'cluster.host' is 'a', this host is 'b' (...)".
absl::Status CheckCluster(const Calibration& c, const ClusterIdentity& here,
                          const std::string& scheduler,
                          const std::string& where);

}  // namespace planner
}  // namespace downpour

#endif  // DOWNPOUR_PLANNER_CALIBRATION_H_
