// ps_bench: throughput and latency of Downpour against raw ZeroMQ, measured
// in the same run on the same machine.
//
//   bazel build -c opt //bench:ps_bench //server:ps_server
//       //scheduler:ps_scheduler   (one command)
//   bazel-bin/bench/ps_bench            # all sections
//   bazel-bin/bench/ps_bench --sections=dense --max_mb=16
//   bazel-bin/bench/ps_bench --sections=dense --servers=1 --min_kb=16384
//   bazel-bin/bench/ps_bench --sections=sparse,keyed,small --rounds=2
//
// Sections: dense (push/pull by size, 1 and 2 servers, beside raw ZeroMQ),
// sparse, keyed and small (key batches and small requests, beside raw
// ZeroMQ: bench/ps_bench_sections.h), memory (server RSS against raw table
// bytes), replication (r = 2 against r = 1, and a backup's catch-up copy).
// Every loop is bounded in count and time.
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>
#include <zmq.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "absl/flags/declare.h"
#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "bench/ps_bench_sections.h"
#include "bench/raw_zmq.h"
#include "client/client.h"
#include "cluster/scheduler_client.h"
#include "common/auth.h"
#include "common/malloc_tuning.h"
#include "common/usage.h"
#include "handlers/handler.h"
#include "launch/local_cluster.h"

// Defined in common/auth.cc: with a secret, the cluster runs with CURVE and
// the dense figures show what encryption costs (the raw ZeroMQ baseline
// stays plain); the --tls_* flags put its gRPC calls on TLS.
ABSL_DECLARE_FLAG(std::string, cluster_secret_file);

ABSL_FLAG(std::string, bin_dir, "",
          "folder with scheduler/ and server/ binaries "
          "(default: next to this binary's folder)");
ABSL_FLAG(std::string, work_dir, "/tmp/ps_bench", "logs of the daemons");
ABSL_FLAG(std::string, sections, "dense,sparse,keyed,small,memory,replication",
          "what to run (latency: the same as small)");
ABSL_FLAG(int, max_mb, 64, "largest dense message, in MiB");
ABSL_FLAG(int, min_kb, 4, "smallest dense message, in KiB (sizes grow by 4x)");
ABSL_FLAG(std::string, servers, "1,2",
          "dense, sparse, keyed: server counts to measure (1, 2)");
ABSL_FLAG(std::vector<std::string>, server_flags, {},
          "extra flags for every ps_server, e.g. --zero_copy_min_kb=-1");
ABSL_FLAG(int, depth, 2, "dense requests in flight");
ABSL_FLAG(double, seconds, 2.0, "time budget per measurement");
ABSL_FLAG(int, client_max_mb, 128, "ClientOptions::max_message_bytes, in MiB");
ABSL_FLAG(int, client_part_kb, -1,
          "ClientOptions::part_bytes, in KiB (-1: the default; 0: off)");
ABSL_FLAG(int, rounds, 1,
          "dense, sparse, keyed, small: raw and Downpour measured "
          "alternately this many times per size and direction");
ABSL_FLAG(std::vector<std::string>, sparse_dists,
          std::vector<std::string>({"uniform", "zipf"}),
          "sparse: key distributions (uniform, zipf: s = 1.1)");
ABSL_FLAG(std::vector<std::string>, sparse_widths,
          std::vector<std::string>({"8", "64"}), "sparse: table widths");
ABSL_FLAG(int, sparse_batch, 100000, "sparse: keys a batch");
ABSL_FLAG(int, sparse_max_batches, 40, "sparse: batches per measurement");
ABSL_FLAG(std::vector<std::string>, sparse_modes,
          std::vector<std::string>({"push", "pull", "summed"}),
          "sparse: what to measure (push, pull, summed: a push to a table "
          "that sums repeats); leaving some out serves a profile of the "
          "others");
ABSL_FLAG(bool, sparse_on_dense, false,
          "sparse: the same batches to a dense table (a row store that "
          "costs an array index), to see the rest of the path");
ABSL_FLAG(int64_t, keyed_keys, 10000000, "keyed: keys in the batch");
ABSL_FLAG(std::vector<std::string>, keyed_strides,
          std::vector<std::string>({"1", "2"}),
          "keyed: distance between the batch's keys (1: every key)");
ABSL_FLAG(int, keyed_reps, 3, "keyed: batches per operation and round");
ABSL_FLAG(int, small_count, 0,
          "small: > 0: only this many pulls, 64 in flight, and their time "
          "(to count their system calls and context switches)");
ABSL_FLAG(bool, small_raw, false,
          "small: with --small_count, raw ZeroMQ's messages instead");

namespace downpour {
namespace {

using bench::RawClient;

void Check(const absl::Status& s, const char* what) {
  if (!s.ok()) {
    std::fprintf(stderr, "%s: %s\n", what, s.ToString().c_str());
    std::exit(1);
  }
}

int ItersFor(size_t bytes) {
  const double budget =
      absl::GetFlag(FLAGS_seconds) * 1.5e9;  // ~1.5 GB/s guess
  return static_cast<int>(std::clamp(budget / bytes, 4.0, 20000.0));
}

// Dense push or pull of `floats` values as a key range, `depth` in flight.
double PsRun(Client* c, const Table& t, Key begin, size_t rows, bool pull,
             int depth, int iters, std::vector<std::vector<float>>* bufs) {
  const size_t n = rows * t.width;
  bufs->resize(depth);
  for (auto& b : *bufs) {
    if (b.size() < n) b.assign(n, 0.001f);
  }
  auto issue = [&](int slot) {
    Keys k = Keys::Range(begin, begin + rows);
    auto& b = (*bufs)[slot];
    return pull ? c->Pull(t, k, absl::MakeSpan(b.data(), n))
                : c->Push(t, k, absl::MakeConstSpan(b.data(), n));
  };
  for (int i = 0; i < depth; ++i) Check(c->Wait(issue(i)), "warm-up");
  std::vector<Ticket> inflight(depth);
  const absl::Time start = absl::Now();
  int sent = 0, done = 0;
  for (; sent < std::min(depth, iters); ++sent) inflight[sent] = issue(sent);
  while (done < iters) {
    const int slot = done % depth;
    Check(c->Wait(inflight[slot]), pull ? "pull" : "push");
    ++done;
    if (sent < iters) {
      inflight[slot] = issue(slot);
      ++sent;
    }
  }
  return n * sizeof(float) * static_cast<double>(iters) /
         absl::ToDoubleSeconds(absl::Now() - start);
}

std::unique_ptr<LocalCluster> StartCluster(
    int servers, const std::string& tag,
    const std::vector<std::string>& scheduler_flags = {}) {
  LocalClusterOptions o;
  o.scheduler_flags = scheduler_flags;
  o.bin_dir = absl::GetFlag(FLAGS_bin_dir).empty()
                  ? BinDirOfThisProgram()
                  : absl::GetFlag(FLAGS_bin_dir);
  o.work_dir = absl::GetFlag(FLAGS_work_dir) + "/" + tag;
  std::system(("mkdir -p " + o.work_dir).c_str());
  o.num_servers = servers;
  o.cluster_secret_file = absl::GetFlag(FLAGS_cluster_secret_file);
  o.tls = ClusterAuth::TlsFilesFromFlags();
  o.server_flags = absl::GetFlag(FLAGS_server_flags);
  auto c = LocalCluster::Start(o);
  Check(c.status(), "start cluster");
  return *std::move(c);
}

std::unique_ptr<Client> Connect(const LocalCluster& cluster, bool spin = true) {
  ClientOptions co;
  if (!spin) co.spin_wait = absl::ZeroDuration();
  co.scheduler_address = cluster.scheduler_address();
  co.max_message_bytes =
      size_t{static_cast<size_t>(absl::GetFlag(FLAGS_client_max_mb))} << 20;
  co.op_timeout = absl::Seconds(120);
  if (absl::GetFlag(FLAGS_client_part_kb) >= 0) {
    co.part_bytes =
        size_t{static_cast<size_t>(absl::GetFlag(FLAGS_client_part_kb))} << 10;
  }
  auto auth = ClusterAuth::FromFlags(kGrpcClient);
  Check(auth.status(), "read --cluster_secret_file and --tls_*");
  co.auth = *auth;
  auto c = Client::Connect(co);
  Check(c.status(), "connect");
  return *std::move(c);
}

void DenseSection(const std::string& raw_endpoint) {
  const int depth = absl::GetFlag(FLAGS_depth);
  const size_t max_bytes =
      size_t{static_cast<size_t>(absl::GetFlag(FLAGS_max_mb))} << 20;
  std::vector<size_t> sizes;
  const size_t min_bytes = std::max<size_t>(
      4096, size_t{static_cast<size_t>(absl::GetFlag(FLAGS_min_kb))} << 10);
  for (size_t s = min_bytes; s <= max_bytes; s *= 4) sizes.push_back(s);
  if (sizes.empty() || sizes.back() != max_bytes) sizes.push_back(max_bytes);
  const std::string servers_flag = absl::GetFlag(FLAGS_servers);
  auto measured = [&](int servers) {
    return servers_flag.find(absl::StrCat(servers)) != std::string::npos;
  };
  RawClient raw(raw_endpoint);
  std::printf("\n## Dense push and pull (GB/s, %d in flight)\n\n", depth);
  std::printf(
      "| size | raw zmq push | 1 srv push | 2 srv push | raw zmq pull | 1 srv "
      "pull | 2 srv pull | push/raw (1 srv, 2 srv) | pull/raw (1 srv, 2 srv) "
      "|\n");
  std::printf("|---|---|---|---|---|---|---|---|---|\n");
  constexpr uint32_t kWidth = 256;  // 1 KiB rows
  const uint64_t rows_total = max_bytes / (kWidth * 4);
  // Per size: raw push, raw pull measured right beside each Downpour
  // measurement (the machine is shared and noisy), for 1 and 2 servers.
  // Server counts not measured stay NaN and print as "-".
  struct Row {
    double raw[2][2] = {{NAN, NAN}, {NAN, NAN}};
    double ps[2][2] = {{NAN, NAN}, {NAN, NAN}};
  };
  std::vector<Row> rows(sizes.size());
  for (int servers = 1; servers <= 2; ++servers) {
    if (!measured(servers)) continue;
    auto cluster = StartCluster(servers, absl::StrCat("dense", servers));
    auto client = Connect(*cluster);
    TableOptions o;
    o.name = "dense";
    o.width = kWidth;
    o.num_keys = rows_total;
    o.handler = "sgd";
    auto t = client->CreateTable(o);
    Check(t.status(), "create table");
    std::vector<std::vector<float>> bufs;
    for (size_t i = 0; i < sizes.size(); ++i) {
      const size_t n = std::max<size_t>(1, sizes[i] / (kWidth * 4));
      // Centred on the middle so that with two servers both take part.
      const Key begin = (rows_total - n) / 2;
      const int iters = ItersFor(sizes[i]);
      // Raw and Downpour alternate `rounds` times; each figure is total
      // bytes over total time, so a burst of load on the shared machine
      // falls on both sides rather than on one.
      const int rounds = std::max(1, absl::GetFlag(FLAGS_rounds));
      for (int pull = 0; pull < 2; ++pull) {
        double raw_s = 0, ps_s = 0;
        for (int round = 0; round < rounds; ++round) {
          raw_s += 1 / raw.Run(sizes[i], pull, depth, iters);
          ps_s +=
              1 / PsRun(client.get(), *t, begin, n, pull, depth, iters, &bufs);
        }
        rows[i].raw[servers - 1][pull] = rounds / raw_s;
        rows[i].ps[servers - 1][pull] = rounds / ps_s;
      }
      std::fprintf(stderr, "  dense, %d server(s), %zu bytes: done\n", servers,
                   sizes[i]);
    }
    client.reset();
    Check(cluster->Stop(), "stop cluster");
  }
  for (size_t i = 0; i < sizes.size(); ++i) {
    const Row& r = rows[i];
    std::string size = sizes[i] >= (1 << 20)
                           ? absl::StrCat(sizes[i] >> 20, " MiB")
                           : absl::StrCat(sizes[i] >> 10, " KiB");
    auto gbs = [](double v) {
      return std::isnan(v) ? std::string("-")
                           : absl::StrFormat("%.2f", v / 1e9);
    };
    // The raw columns show the run beside 1 server, else beside 2.
    auto first = [](double a, double b) { return std::isnan(a) ? b : a; };
    auto pct = [](double a, double b) {
      return std::isnan(a) ? std::string("-")
                           : absl::StrFormat("%.0f%%", 100 * a / b);
    };
    std::printf("| %s | %s | %s | %s | %s | %s | %s | %s, %s | %s, %s |\n",
                size.c_str(), gbs(first(r.raw[0][0], r.raw[1][0])).c_str(),
                gbs(r.ps[0][0]).c_str(), gbs(r.ps[1][0]).c_str(),
                gbs(first(r.raw[0][1], r.raw[1][1])).c_str(),
                gbs(r.ps[0][1]).c_str(), gbs(r.ps[1][1]).c_str(),
                pct(r.ps[0][0], r.raw[0][0]).c_str(),
                pct(r.ps[1][0], r.raw[1][0]).c_str(),
                pct(r.ps[0][1], r.raw[0][1]).c_str(),
                pct(r.ps[1][1], r.raw[1][1]).c_str());
  }
  std::fflush(stdout);
}

// p50 of one-at-a-time operations, in microseconds.
double MedianMicros(const std::function<void()>& op) {
  for (int i = 0; i < 200; ++i) op();
  std::vector<double> us;
  const absl::Time stop =
      absl::Now() + absl::Seconds(absl::GetFlag(FLAGS_seconds));
  while (us.size() < 20000 && absl::Now() < stop) {
    const absl::Time a = absl::Now();
    op();
    us.push_back(absl::ToDoubleMicroseconds(absl::Now() - a));
  }
  std::sort(us.begin(), us.end());
  return us[us.size() / 2];
}

// Requests or rows: what a push of `bytes` of gradient to an adagrad
// table costs the replication beyond r = 1, by parts, in this process.
// Forwarding the request (what Downpour does) sends the gradient and has
// the backup replay the handler; shipping the rows would have the primary
// gather values and accumulators (twice the bytes), send them, and the
// backup copy them in. Wire: raw ZeroMQ over loopback; copies and the
// handler on warm buffers. Row shipping is not built, so this is its cost
// by parts, not end to end.
void RequestsOrRows(const std::string& raw_endpoint) {
  auto handler = CreateHandler(
      [] {
        proto::HandlerSpec h;
        h.set_name("adagrad");
        return h;
      }(),
      nullptr);
  Check(handler.status(), "adagrad");
  constexpr size_t kWidth = 256;
  RawClient raw(raw_endpoint);
  std::printf(
      "\n| requests or rows (adagrad, per push, us) | wire (grad) | "
      "replay | requests | gather | wire (2x) | copy in | rows | "
      "rows/requests |\n|---|---|---|---|---|---|---|---|---|\n");
  for (size_t bytes : {size_t{1} << 20, size_t{4} << 20, size_t{16} << 20}) {
    const size_t n = bytes / sizeof(float), rows = n / kWidth;
    const size_t state = rows * (*handler)->StateWidth(kWidth);
    std::vector<float> values(n, 0.5f), acc(state, 0.1f), grads(n, 0.001f);
    std::vector<float> shipped(n + state), in(n + state);
    const int iters = std::max(4, ItersFor(bytes));
    auto per_op_us = [&](const std::function<void()>& op) {
      op();  // warm
      const absl::Time start = absl::Now();
      for (int i = 0; i < iters; ++i) op();
      return absl::ToDoubleMicroseconds(absl::Now() - start) / iters;
    };
    const double wire1 = 1e6 * bytes / raw.Run(bytes, false, 2, iters);
    const double wire2 =
        1e6 * (2.0 * bytes) / raw.Run(2 * bytes, false, 2, iters);
    const double replay = per_op_us([&] {
      (*handler)->Apply(values.data(), acc.data(), grads.data(), rows, kWidth);
    });
    const double gather = per_op_us([&] {
      std::memcpy(shipped.data(), values.data(), n * sizeof(float));
      std::memcpy(shipped.data() + n, acc.data(), state * sizeof(float));
    });
    const double copy_in = per_op_us([&] {
      std::memcpy(in.data(), shipped.data(), shipped.size() * sizeof(float));
    });
    const double requests = wire1 + replay,
                 rows_cost = gather + wire2 + copy_in;
    std::printf(
        "| %zu MiB | %.0f | %.0f | %.0f | %.0f | %.0f | %.0f | %.0f | "
        "%.2f |\n",
        bytes >> 20, wire1, replay, requests, gather, wire2, copy_in, rows_cost,
        rows_cost / requests);
    std::fflush(stdout);
  }
}

// Replication's cost: the same two-server cluster with --replicas=1 and
// --replicas=2, measured alternately. Writes forward the request itself to
// the backup (the gradient, not the rows it changed); a catching-up backup
// gets rows, values and handler state, whose copy speed is measured too.
void ReplicationSection(const std::string& raw_endpoint) {
  const int depth = absl::GetFlag(FLAGS_depth);
  const int rounds = std::max(1, absl::GetFlag(FLAGS_rounds));
  constexpr uint32_t kWidth = 256;  // 1 KiB rows
  const size_t max_bytes =
      size_t{static_cast<size_t>(absl::GetFlag(FLAGS_max_mb))} << 20;
  const uint64_t rows_total = 2 * max_bytes / (kWidth * 4);
  std::unique_ptr<LocalCluster> clusters[2];
  std::unique_ptr<Client> clients[2];
  Table tables[2];
  for (int r = 0; r < 2; ++r) {
    clusters[r] = StartCluster(2, absl::StrCat("replicas", r + 1),
                               {absl::StrCat("--replicas=", r + 1)});
    clients[r] = Connect(*clusters[r]);
    TableOptions o;
    o.name = "dense";
    o.width = kWidth;
    o.num_keys = rows_total;
    o.handler = "adagrad";
    auto t = clients[r]->CreateTable(o);
    Check(t.status(), "create table");
    tables[r] = *t;
  }
  std::printf(
      "\n## Replication (2 servers, adagrad, GB/s with %d in flight; "
      "r = 2 against r = 1, alternated %d times)\n\n",
      depth, rounds);
  std::printf(
      "| size | push r=1 | push r=2 | r=2/r=1 | pull r=1 | pull r=2 | r=2/r=1 "
      "|\n");
  std::printf("|---|---|---|---|---|---|---|\n");
  std::vector<std::vector<float>> bufs;
  for (size_t size = 256 << 10; size <= max_bytes; size *= 4) {
    const size_t n = size / (kWidth * 4);
    const int iters = ItersFor(size);
    double gbs[2][2];  // [pull][r]
    for (int pull = 0; pull < 2; ++pull) {
      double secs[2] = {0, 0};
      for (int round = 0; round < rounds; ++round) {
        for (int r = 0; r < 2; ++r) {
          // Within the first range, so one primary (and its backup) serve it.
          secs[r] += 1 / PsRun(clients[r].get(), tables[r], 0, n, pull, depth,
                               iters, &bufs);
        }
      }
      for (int r = 0; r < 2; ++r) gbs[pull][r] = rounds / secs[r];
    }
    std::printf("| %s | %.2f | %.2f | %.0f%% | %.2f | %.2f | %.0f%% |\n",
                size >= (1 << 20) ? absl::StrCat(size >> 20, " MiB").c_str()
                                  : absl::StrCat(size >> 10, " KiB").c_str(),
                gbs[0][0] / 1e9, gbs[0][1] / 1e9, 100 * gbs[0][1] / gbs[0][0],
                gbs[1][0] / 1e9, gbs[1][1] / 1e9, 100 * gbs[1][1] / gbs[1][0]);
    std::fflush(stdout);
    std::fprintf(stderr, "  replication, %zu bytes: done\n", size);
  }
  std::printf(
      "\n| 4-byte op, one at a time (p50) | r=1 | r=2 |\n|---|---|---|\n");
  std::vector<Key> key = {7};
  std::vector<float> one(kWidth), out(kWidth);
  double pull_us[2], add_us[2];
  for (int r = 0; r < 2; ++r) {
    Client* c = clients[r].get();
    const Table& t = tables[r];
    pull_us[r] = MedianMicros(
        [&] { Check(c->PullSync(t, key, absl::MakeSpan(out)), "pull"); });
    add_us[r] = MedianMicros([&] { Check(c->AddSync(t, key, one), "add"); });
  }
  std::printf("| pull (1 KiB row) | %.0f us | %.0f us |\n", pull_us[0],
              pull_us[1]);
  std::printf("| add (1 KiB row) | %.0f us | %.0f us |\n", add_us[0],
              add_us[1]);
  for (int r = 0; r < 2; ++r) {
    clients[r].reset();
    Check(clusters[r]->Stop(), "stop cluster");
  }
  RequestsOrRows(raw_endpoint);

  // Catch-up: one server holds a range of every row written (values and
  // adagrad's accumulators); a second joins and copies it while idle.
  auto cluster = StartCluster(1, "catchup", {"--replicas=2"});
  auto client = Connect(*cluster);
  TableOptions o;
  o.name = "big";
  o.width = kWidth;
  o.num_keys = rows_total;
  o.handler = "adagrad";
  auto t = client->CreateTable(o);
  Check(t.status(), "create table");
  std::vector<float> v(16384 * kWidth, 0.5f);
  for (Key k = 0; k < rows_total; k += 16384) {
    const Key e = std::min<Key>(rows_total, k + 16384);
    Check(client->PushSync(*t, Keys::Range(k, e),
                           absl::MakeConstSpan(v.data(), (e - k) * kWidth)),
          "fill");
  }
  SchedulerClient sched(cluster->scheduler_address());
  const absl::Time start = absl::Now();
  Check(cluster->AddServer(), "add server");
  bool synced = false;
  while (!synced && absl::Now() - start < absl::Seconds(120)) {
    auto map = sched.GetClusterMap();
    Check(map.status(), "map");
    synced = map->tables_size() == 1 &&
             map->tables(0).ranges(0).replicas_size() == 1;
    if (!synced) absl::SleepFor(absl::Milliseconds(2));
  }
  const double secs = absl::ToDoubleSeconds(absl::Now() - start);
  const double bytes = 2.0 * rows_total * kWidth * 4;  // values + accumulators
  std::printf(
      "\n| catch-up copy of one range (values + adagrad state) | %s "
      "|\n|---|---|\n",
      synced ? "" : "(did not finish)");
  std::printf(
      "| bytes | %.0f MiB |\n| from the new server's start to in sync | %.2f s "
      "|\n"
      "| rate | %.2f GB/s |\n",
      bytes / 1048576, secs, bytes / secs / 1e9);
  client.reset();
  Check(cluster->Stop(), "stop cluster");
}

uint64_t RssBytes(pid_t pid) {
  std::ifstream in(absl::StrCat("/proc/", pid, "/status"));
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("VmRSS:", 0) == 0) return std::stoull(line.substr(6)) * 1024;
  }
  return 0;
}

void MemorySection() {
  auto cluster = StartCluster(1, "memory");
  auto client = Connect(*cluster);
  const uint64_t before = RssBytes(cluster->server(0).pid());
  TableOptions o;
  o.name = "big";
  o.width = 64;
  o.num_keys = 4'000'000;  // 1 GiB of values
  o.handler = "sum";       // stateless: no handler state
  auto t = client->CreateTable(o);
  Check(t.status(), "create table");
  std::vector<float> v(16384 * 64, 1.0f);
  for (Key k = 0; k + 16384 <= o.num_keys; k += 16384) {
    Check(client->PushSync(*t, Keys::Range(k, k + 16384), v), "push");
  }
  const uint64_t raw = o.num_keys * o.width * 4;
  const uint64_t after = RssBytes(cluster->server(0).pid());
  std::printf(
      "\n## Server memory (dense table, width 64, 4M keys, every row "
      "pushed)\n\n");
  std::printf(
      "| raw values | server RSS before | after | (after - before) / raw "
      "|\n|---|---|---|---|\n");
  std::printf("| %.0f MiB | %.0f MiB | %.0f MiB | %.3f |\n", raw / 1048576.0,
              before / 1048576.0, after / 1048576.0,
              static_cast<double>(after - before) / raw);
  client.reset();
  Check(cluster->Stop(), "stop cluster");
}

// The key-batch sections' view of this program's flags and clusters.
bench::SectionEnv SectionEnvFromFlags(const std::string& raw_endpoint,
                                      int raw_pid) {
  bench::SectionEnv env;
  env.raw_endpoint = raw_endpoint;
  env.raw_pid = raw_pid;
  env.seconds = absl::GetFlag(FLAGS_seconds);
  env.rounds = std::max(1, absl::GetFlag(FLAGS_rounds));
  env.servers.clear();
  for (int servers : {1, 2}) {
    if (absl::GetFlag(FLAGS_servers).find(absl::StrCat(servers)) !=
        std::string::npos) {
      env.servers.push_back(servers);
    }
  }
  env.start = [](int servers, const std::string& tag) {
    return StartCluster(servers, tag);
  };
  env.connect = [](const LocalCluster& cluster) { return Connect(cluster); };
  env.connect_sleeping = [](const LocalCluster& cluster) {
    return Connect(cluster, /*spin=*/false);
  };
  return env;
}

std::vector<int> Ints(const std::vector<std::string>& flag, const char* name) {
  std::vector<int> out;
  for (const std::string& s : flag) {
    int v;
    if (!absl::SimpleAtoi(s, &v) || v <= 0) {
      std::fprintf(stderr, "--%s: '%s' is not a positive number\n", name,
                   s.c_str());
      std::exit(2);
    }
    out.push_back(v);
  }
  return out;
}

}  // namespace
}  // namespace downpour

int main(int argc, char** argv) {
  downpour::SetUsage(
      "parameter-server benchmarks on a local cluster (usage: ps_bench "
      "[--sections=...] [flags])");
  absl::ParseCommandLine(argc, argv);
  downpour::TuneAllocatorForLargeMessages();
  // The raw ZeroMQ peer is forked before any thread starts.
  pid_t child = -1;
  const std::string ep = downpour::bench::StartRawServer(&child);
  if (ep.empty()) return 1;

  const std::string sections = absl::GetFlag(FLAGS_sections);
  auto wants = [&](const char* name) {
    return sections.find(name) != std::string::npos;
  };
  std::printf("# ps_bench (%s)\n", absl::FormatTime(absl::Now()).c_str());
  const downpour::bench::SectionEnv env =
      downpour::SectionEnvFromFlags(ep, child);
  if (wants("dense")) downpour::DenseSection(ep);
  if (wants("sparse")) {
    downpour::bench::SparseOptions o;
    o.dists = absl::GetFlag(FLAGS_sparse_dists);
    o.widths =
        downpour::Ints(absl::GetFlag(FLAGS_sparse_widths), "sparse_widths");
    o.batch = std::max(1, absl::GetFlag(FLAGS_sparse_batch));
    o.max_batches = std::max(2, absl::GetFlag(FLAGS_sparse_max_batches));
    o.dense = absl::GetFlag(FLAGS_sparse_on_dense);
    o.modes = absl::GetFlag(FLAGS_sparse_modes);
    downpour::bench::SparseSection(env, o);
  }
  if (wants("keyed")) {
    downpour::bench::KeyedOptions o;
    o.keys = std::max<int64_t>(1, absl::GetFlag(FLAGS_keyed_keys));
    o.strides =
        downpour::Ints(absl::GetFlag(FLAGS_keyed_strides), "keyed_strides");
    o.reps = std::max(1, absl::GetFlag(FLAGS_keyed_reps));
    downpour::bench::KeyedSection(env, o);
  }
  if (wants("small") || wants("latency")) {
    downpour::bench::SmallOptions o;
    o.count = absl::GetFlag(FLAGS_small_count);
    o.raw = absl::GetFlag(FLAGS_small_raw);
    downpour::bench::SmallSection(env, o);
  }
  if (wants("memory")) downpour::MemorySection();
  if (wants("replication")) downpour::ReplicationSection(ep);
  downpour::bench::RawClient(ep).Quit();
  int status;
  waitpid(child, &status, 0);
  return 0;
}
