// ps_bench: throughput and latency of Downpour against raw ZeroMQ, measured
// in the same run on the same machine.
//
//   bazel build -c opt //bench:ps_bench //server:ps_server
//   //scheduler:ps_scheduler bazel-bin/bench/ps_bench            # all sections
//   bazel-bin/bench/ps_bench --sections=dense --max_mb=16
//   bazel-bin/bench/ps_bench --sections=dense --servers=1 --min_kb=16384
//
// Sections: dense (push/pull by size, 1 and 2 servers, beside raw ZeroMQ),
// sparse (power-law keys, width 8 and 64), latency (small pulls), memory
// (server RSS against raw table bytes), replication (r = 2 against r = 1,
// and a backup's catch-up copy). Every loop is bounded in count and
// time.
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
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
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
ABSL_FLAG(std::string, sections, "dense,sparse,latency,memory,replication",
          "what to run");
ABSL_FLAG(int, max_mb, 64, "largest dense message, in MiB");
ABSL_FLAG(int, min_kb, 4, "smallest dense message, in KiB (sizes grow by 4x)");
ABSL_FLAG(std::string, servers, "1,2",
          "dense: server counts to measure (1, 2)");
ABSL_FLAG(std::vector<std::string>, server_flags, {},
          "extra flags for every ps_server, e.g. --zero_copy_min_kb=-1");
ABSL_FLAG(int, depth, 2, "dense requests in flight");
ABSL_FLAG(double, seconds, 2.0, "time budget per measurement");
ABSL_FLAG(int, client_max_mb, 128, "ClientOptions::max_message_bytes, in MiB");
ABSL_FLAG(int, rounds, 1,
          "dense: raw and Downpour measured alternately this "
          "many times per size and direction");

namespace downpour {
namespace {

void Check(const absl::Status& s, const char* what) {
  if (!s.ok()) {
    std::fprintf(stderr, "%s: %s\n", what, s.ToString().c_str());
    std::exit(1);
  }
}

// ---------------------------------------------------------------------------
// Raw ZeroMQ baseline: a child process with a ROUTER socket. A request whose
// first byte is 'P' asks for a reply of the size in the rest; anything else
// gets a 1-byte reply. Buffers are reused on both sides, sends are zero-copy.

void NoFree(void*, void*) {}

[[noreturn]] void RawServer(int endpoint_pipe) {
  TuneAllocatorForLargeMessages();
  void* ctx = zmq_ctx_new();
  // Ends with the parent (or on its 'Q' message).
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  void* s = zmq_socket(ctx, ZMQ_ROUTER);
  zmq_bind(s, "tcp://127.0.0.1:*");
  char ep[256];
  size_t len = sizeof(ep);
  zmq_getsockopt(s, ZMQ_LAST_ENDPOINT, ep, &len);
  ssize_t unused = write(endpoint_pipe, ep, strlen(ep) + 1);
  (void)unused;
  close(endpoint_pipe);
  std::vector<char> big(size_t{256} << 20);
  std::memset(big.data(), 1, big.size());
  while (true) {
    zmq_msg_t id, body;
    zmq_msg_init(&id);
    zmq_msg_init(&body);
    if (zmq_msg_recv(&id, s, 0) < 0) break;
    zmq_msg_recv(&body, s, 0);
    const char* d = static_cast<const char*>(zmq_msg_data(&body));
    const bool quit = zmq_msg_size(&body) == 1 && d[0] == 'Q';
    size_t reply = 1;
    if (zmq_msg_size(&body) == 9 && d[0] == 'P') std::memcpy(&reply, d + 1, 8);
    zmq_msg_send(&id, s, ZMQ_SNDMORE);
    zmq_msg_t r;
    zmq_msg_init_data(&r, big.data(), std::min(reply, big.size()), NoFree,
                      nullptr);
    zmq_msg_send(&r, s, 0);
    zmq_msg_close(&body);
    if (quit) break;
  }
  _exit(0);
}

class RawClient {
 public:
  explicit RawClient(const std::string& endpoint) {
    ctx_ = zmq_ctx_new();
    s_ = zmq_socket(ctx_, ZMQ_DEALER);
    int timeout = 60000;  // a lost peer fails the run instead of hanging it
    zmq_setsockopt(s_, ZMQ_RCVTIMEO, &timeout, sizeof(timeout));
    zmq_connect(s_, endpoint.c_str());
  }
  ~RawClient() {
    zmq_close(s_);
    zmq_ctx_term(ctx_);
  }
  // Tells the peer process to exit (once, at the end of the run).
  void Quit() {
    zmq_send(s_, "Q", 1, 0);
    zmq_msg_t m;
    zmq_msg_init(&m);
    zmq_msg_recv(&m, s_, 0);
    zmq_msg_close(&m);
  }
  // Bytes per second moving `size` bytes per request (push: request carries
  // them; pull: reply carries them), `depth` in flight.
  double Run(size_t size, bool pull, int depth, int iters) {
    if (buf_.size() < size) {
      buf_.resize(size);
      std::memset(buf_.data(), 2, size);
    }
    auto send = [&] {
      zmq_msg_t m;
      if (pull) {
        char req[9] = {'P'};
        std::memcpy(req + 1, &size, 8);
        zmq_send(s_, req, 9, 0);
      } else {
        zmq_msg_init_data(&m, buf_.data(), size, NoFree, nullptr);
        zmq_msg_send(&m, s_, 0);
      }
    };
    auto recv = [&] {
      zmq_msg_t m;
      zmq_msg_init(&m);
      if (zmq_msg_recv(&m, s_, 0) < 0) {
        std::fprintf(stderr, "raw zmq peer did not answer\n");
        std::exit(1);
      }
      zmq_msg_close(&m);
    };
    for (int i = 0; i < depth; ++i) send();  // warm-up
    for (int i = 0; i < depth; ++i) recv();
    const absl::Time start = absl::Now();
    int sent = 0, got = 0;
    for (; sent < std::min(depth, iters); ++sent) send();
    while (got < iters) {
      recv();
      ++got;
      if (sent < iters) {
        send();
        ++sent;
      }
    }
    return size * static_cast<double>(iters) /
           absl::ToDoubleSeconds(absl::Now() - start);
  }

 private:
  void* ctx_;
  void* s_;
  std::vector<char> buf_;
};

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

std::unique_ptr<Client> Connect(const LocalCluster& cluster) {
  ClientOptions co;
  co.scheduler_address = cluster.scheduler_address();
  co.max_message_bytes =
      size_t{static_cast<size_t>(absl::GetFlag(FLAGS_client_max_mb))} << 20;
  co.op_timeout = absl::Seconds(120);
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

void SparseSection() {
  auto cluster = StartCluster(2, "sparse");
  auto client = Connect(*cluster);
  constexpr uint64_t kDistinct = 1'000'000;
  constexpr size_t kBatch = 100'000;
  std::printf(
      "\n## Sparse batches (1M distinct keys, power law s=1.1, %zu keys a "
      "batch, 2 servers)\n\n",
      kBatch);
  std::printf("| width | push keys/s | pull keys/s |\n|---|---|---|\n");
  // Zipf ranks by inverse transform over a precomputed CDF.
  std::vector<double> cdf(kDistinct);
  double sum = 0;
  for (uint64_t i = 0; i < kDistinct; ++i)
    cdf[i] = (sum += 1.0 / std::pow(i + 1.0, 1.1));
  std::mt19937_64 rng(42);
  std::uniform_real_distribution<double> u(0, sum);
  std::vector<Key> keys(kBatch);
  for (uint32_t width : {8u, 64u}) {
    TableOptions o;
    o.name = absl::StrCat("sparse", width);
    o.sparse = true;
    o.width = width;
    o.handler = "adagrad";
    auto t = client->CreateTable(o);
    Check(t.status(), "create sparse table");
    // Touch every distinct key once so the table holds 1M rows.
    std::vector<Key> all(kDistinct);
    for (uint64_t i = 0; i < kDistinct; ++i)
      all[i] = i * 0x9E3779B97F4A7C15ull % kKeySpaceEnd;
    std::vector<float> init(kDistinct * width, 0.0f);
    Check(client->PutSync(*t, all, init), "fill");
    std::vector<float> vals(kBatch * width, 0.01f), out(kBatch * width);
    double push_s = 0, pull_s = 0;
    int batches = 0;
    const absl::Time stop =
        absl::Now() + absl::Seconds(2 * absl::GetFlag(FLAGS_seconds));
    while (batches < 50 && absl::Now() < stop) {
      for (Key& k : keys) {
        const uint64_t rank =
            std::lower_bound(cdf.begin(), cdf.end(), u(rng)) - cdf.begin();
        k = all[std::min(rank, kDistinct - 1)];
      }
      absl::Time a = absl::Now();
      Check(client->PushSync(*t, keys, vals), "sparse push");
      absl::Time b = absl::Now();
      Check(client->PullSync(*t, keys, absl::MakeSpan(out)), "sparse pull");
      pull_s += absl::ToDoubleSeconds(absl::Now() - b);
      push_s += absl::ToDoubleSeconds(b - a);
      ++batches;
    }
    std::printf("| %u | %.2fM | %.2fM |\n", width,
                batches * kBatch / push_s / 1e6,
                batches * kBatch / pull_s / 1e6);
    std::fflush(stdout);
  }
  client.reset();
  Check(cluster->Stop(), "stop cluster");
}

void LatencySection() {
  auto cluster = StartCluster(1, "latency");
  auto client = Connect(*cluster);
  TableOptions o;
  o.name = "tiny";
  o.num_keys = 1024;
  auto t = client->CreateTable(o);
  Check(t.status(), "create table");
  std::vector<Key> key = {7};
  std::vector<float> out(1);
  std::vector<double> us;
  for (int i = 0; i < 200; ++i)
    Check(client->PullSync(*t, key, absl::MakeSpan(out)), "warm");
  const absl::Time stop =
      absl::Now() + absl::Seconds(absl::GetFlag(FLAGS_seconds));
  while (us.size() < 20000 && absl::Now() < stop) {
    absl::Time a = absl::Now();
    Check(client->PullSync(*t, key, absl::MakeSpan(out)), "pull");
    us.push_back(absl::ToDoubleMicroseconds(absl::Now() - a));
  }
  std::sort(us.begin(), us.end());
  std::printf("\n## Small operations (4-byte pull, 1 server)\n\n");
  std::printf("| measure | value |\n|---|---|\n");
  std::printf("| latency p50, one at a time | %.0f us |\n", us[us.size() / 2]);
  std::printf("| latency p99, one at a time | %.0f us |\n",
              us[us.size() * 99 / 100]);
  std::printf("| pulls/s, one at a time | %.1fk |\n",
              us.size() / std::accumulate(us.begin(), us.end(), 0.0) * 1e3);
  for (int depth : {8, 64}) {
    std::vector<std::vector<float>> outs(depth, std::vector<float>(1));
    std::vector<Ticket> inflight(depth);
    int done = 0;
    const absl::Time start = absl::Now();
    const absl::Time end = start + absl::Seconds(absl::GetFlag(FLAGS_seconds));
    for (int i = 0; i < depth; ++i)
      inflight[i] = client->Pull(*t, key, absl::MakeSpan(outs[i]));
    while (absl::Now() < end && done < 2'000'000) {
      const int slot = done % depth;
      Check(client->Wait(inflight[slot]), "pull");
      inflight[slot] = client->Pull(*t, key, absl::MakeSpan(outs[slot]));
      ++done;
    }
    for (int i = 0; i < depth; ++i)
      Check(client->Wait(inflight[(done + i) % depth]), "drain");
    std::printf("| pulls/s, %d in flight | %.1fk |\n", depth,
                done / absl::ToDoubleSeconds(absl::Now() - start) / 1e3);
  }
  client.reset();
  Check(cluster->Stop(), "stop cluster");
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

}  // namespace
}  // namespace downpour

int main(int argc, char** argv) {
  downpour::SetUsage(
      "parameter-server benchmarks on a local cluster (usage: ps_bench "
      "[--sections=...] [flags])");
  absl::ParseCommandLine(argc, argv);
  downpour::TuneAllocatorForLargeMessages();
  // The raw ZeroMQ peer is forked before any thread starts.
  int fds[2];
  if (pipe(fds) != 0) return 1;
  pid_t child = fork();
  if (child == 0) {
    close(fds[0]);
    downpour::RawServer(fds[1]);
  }
  close(fds[1]);
  char ep[256] = {0};
  if (read(fds[0], ep, sizeof(ep)) <= 0) return 1;
  close(fds[0]);

  const std::string sections = absl::GetFlag(FLAGS_sections);
  std::printf("# ps_bench (%s)\n", absl::FormatTime(absl::Now()).c_str());
  if (sections.find("dense") != std::string::npos) downpour::DenseSection(ep);
  if (sections.find("sparse") != std::string::npos) downpour::SparseSection();
  if (sections.find("latency") != std::string::npos) downpour::LatencySection();
  if (sections.find("memory") != std::string::npos) downpour::MemorySection();
  if (sections.find("replication") != std::string::npos) {
    downpour::ReplicationSection(ep);
  }
  downpour::RawClient(ep).Quit();
  int status;
  waitpid(child, &status, 0);
  return 0;
}
