// soak_bench: many clients writing through a server's death and return.
//
//   bazel build -c opt //bench:soak_bench //server:ps_server
//   //scheduler:ps_scheduler bazel-bin/bench/soak_bench --clients=64
//   --seconds=30
//
// A scheduler with --replicas=2 and two servers; `--clients` clients (each
// its own SDK instance, so its own connections), driven by a few threads,
// keep `--window` adds of known amounts in flight each, on a dense and a
// sparse table, for a fixed time. At 1/3 of the run one server is killed
// with SIGKILL (the other serves everything, without a backup); at 1/2 it
// is started again (a new process under the same name: it joins as the
// backup of every range and catches up while the writes go on). Prints the
// acknowledged adds per second before, during and after, the failover as the
// writers saw it (the longest time any window had no acknowledgement), and then
// checks the final state exactly: every acknowledged add is there once (adds
// of 1.0 sum exactly in float). Exits 1 if anything was lost, doubled, or
// failed.
#include <signal.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <random>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "client/client.h"
#include "cluster/scheduler_client.h"
#include "common/malloc_tuning.h"
#include "common/usage.h"
#include "launch/local_cluster.h"

ABSL_FLAG(std::string, bin_dir, "",
          "folder with scheduler/ and server/ "
          "binaries (default: next to this binary's folder)");
ABSL_FLAG(std::string, work_dir, "/tmp/soak_bench", "logs of the daemons");
ABSL_FLAG(int, clients, 64, "client SDK instances (connections)");
ABSL_FLAG(int, threads, 8, "threads driving them");
ABSL_FLAG(int, window, 4, "adds in flight per client");
ABSL_FLAG(double, seconds, 30, "length of the run");
ABSL_FLAG(int, replicas, 2, "ps_scheduler --replicas");
ABSL_FLAG(bool, balance_primaries, true,
          "ps_scheduler --balance_primaries (false: the survivor stays the "
          "primary of every range after the restart)");

namespace downpour {
namespace {

constexpr Key kDenseKeys = 20000;
constexpr uint32_t kWidth = 8;
constexpr int kSparseKeys = 2000;

Key SparseKey(int i) {
  return (static_cast<Key>(i) * 0x9E3779B97F4A7C15ull) % (kKeySpaceEnd - 1);
}

void Check(const absl::Status& s, const char* what) {
  if (!s.ok()) {
    std::fprintf(stderr, "%s: %s\n", what, s.ToString().c_str());
    std::exit(1);
  }
}

// Acknowledged adds per row: the exact expected state.
struct Expected {
  absl::Mutex mu;
  std::vector<uint32_t> dense ABSL_GUARDED_BY(mu) =
      std::vector<uint32_t>(kDenseKeys, 0);
  std::vector<uint32_t> sparse ABSL_GUARDED_BY(mu) =
      std::vector<uint32_t>(kSparseKeys, 0);
};

struct Add {
  Ticket ticket = 0;
  bool busy = false;
  bool sparse = false;
  std::vector<Key> rows;  // dense rows or sparse pool indices
  std::vector<Key> keys;  // as sent
  std::vector<float> values;
};

int Main() {
  TuneAllocatorForLargeMessages();
  LocalClusterOptions o;
  o.bin_dir = absl::GetFlag(FLAGS_bin_dir).empty()
                  ? BinDirOfThisProgram()
                  : absl::GetFlag(FLAGS_bin_dir);
  o.work_dir = absl::GetFlag(FLAGS_work_dir);
  if (std::system(("mkdir -p " + o.work_dir).c_str()) != 0) return 1;
  o.num_servers = 2;
  o.scheduler_flags = {
      absl::StrCat("--replicas=", absl::GetFlag(FLAGS_replicas)),
      absl::StrCat("--balance_primaries=",
                   absl::GetFlag(FLAGS_balance_primaries) ? "true" : "false")};
  auto cluster = LocalCluster::Start(o);
  Check(cluster.status(), "start cluster");
  const std::string scheduler = (*cluster)->scheduler_address();

  ClientOptions co;
  co.scheduler_address = scheduler;
  co.op_timeout = absl::Seconds(60);
  auto admin = Client::Connect(co);
  Check(admin.status(), "connect");
  TableOptions d;
  d.name = "dense";
  d.width = kWidth;
  d.num_keys = kDenseKeys;
  d.handler = "sum";
  auto dense = (*admin)->CreateTable(d);
  Check(dense.status(), "create dense");
  TableOptions s;
  s.name = "sparse";
  s.sparse = true;
  s.width = kWidth;
  s.handler = "sum";
  auto sparse = (*admin)->CreateTable(s);
  Check(sparse.status(), "create sparse");

  const int n_clients = absl::GetFlag(FLAGS_clients);
  const int n_threads =
      std::max(1, std::min(absl::GetFlag(FLAGS_threads), n_clients));
  const int window = std::max(1, absl::GetFlag(FLAGS_window));
  std::vector<std::unique_ptr<Client>> clients;
  for (int i = 0; i < n_clients; ++i) {
    auto c = Client::Connect(co);
    Check(c.status(), "connect client");
    clients.push_back(std::move(*c));
  }
  Expected expected;
  const absl::Duration run = absl::Seconds(absl::GetFlag(FLAGS_seconds));
  const absl::Time start = absl::Now();
  const absl::Time stop = start + run;
  // Acknowledged adds per 100 ms slot, and the longest stretch any client
  // waited for an acknowledgement.
  const int slots = static_cast<int>(absl::ToDoubleSeconds(run) * 10) + 100;
  std::vector<std::atomic<uint64_t>> acked(slots);
  std::atomic<int64_t> longest_wait_us{0};
  std::atomic<int> failures{0};
  auto drive = [&](int t) {
    std::mt19937_64 rng(1000 + t);
    std::vector<int> mine;
    for (int c = t; c < n_clients; c += n_threads) mine.push_back(c);
    std::vector<std::vector<Add>> adds(mine.size(), std::vector<Add>(window));
    std::vector<absl::Time> last_ack(mine.size(), absl::Now());
    auto land = [&](size_t ci, Add& a) {
      const absl::Status st =
          clients[mine[ci]]->Wait(a.ticket, absl::Minutes(2));
      a.busy = false;
      if (!st.ok()) {
        if (failures.fetch_add(1) < 5) {
          std::fprintf(stderr, "add failed: %s\n", st.ToString().c_str());
        }
        return;
      }
      const absl::Time now = absl::Now();
      const int64_t waited = absl::ToInt64Microseconds(now - last_ack[ci]);
      last_ack[ci] = now;
      for (int64_t seen = longest_wait_us.load();
           waited > seen &&
           !longest_wait_us.compare_exchange_weak(seen, waited);) {
      }
      const int slot = std::min<int>(
          slots - 1, absl::ToInt64Milliseconds(now - start) / 100);
      acked[slot].fetch_add(1, std::memory_order_relaxed);
      absl::MutexLock lock(&expected.mu);
      for (Key r : a.rows) (a.sparse ? expected.sparse : expected.dense)[r]++;
    };
    for (uint64_t i = 0; absl::Now() < stop; ++i) {
      const size_t ci = i % mine.size();
      Add& a = adds[ci][(i / mine.size()) % window];
      if (a.busy) land(ci, a);
      a.rows.clear();
      a.keys.clear();
      a.sparse = rng() % 4 == 0;
      const int n = a.sparse ? 4 : 16;
      for (int k = 0; k < n; ++k) {
        a.rows.push_back(a.sparse ? rng() % kSparseKeys : rng() % kDenseKeys);
      }
      std::sort(a.rows.begin(), a.rows.end());
      a.rows.erase(std::unique(a.rows.begin(), a.rows.end()), a.rows.end());
      for (Key r : a.rows)
        a.keys.push_back(a.sparse ? SparseKey(static_cast<int>(r)) : r);
      a.values.assign(a.rows.size() * kWidth, 1.0f);
      a.ticket =
          clients[mine[ci]]->Add(a.sparse ? *sparse : *dense, a.keys, a.values);
      a.busy = true;
    }
    for (size_t ci = 0; ci < mine.size(); ++ci) {
      for (Add& a : adds[ci]) {
        if (a.busy) land(ci, a);
      }
    }
  };
  std::vector<std::thread> threads;
  for (int t = 0; t < n_threads; ++t) threads.emplace_back(drive, t);

  // Kill the primary of the first dense range at 1/3, restart it at 1/2.
  SchedulerClient sched(scheduler);
  absl::SleepFor(start + run / 3 - absl::Now());
  auto map = sched.GetClusterMap();
  Check(map.status(), "map");
  const NodeId victim = map->tables(0).ranges(0).primary();
  int index = -1;
  for (const auto& n : map->nodes()) {
    if (n.id() == victim) index = std::stoi(n.name().substr(7));
  }
  const absl::Time killed = absl::Now();
  (*cluster)->server(index).Signal(SIGKILL);
  Check((*cluster)->server(index).Wait(absl::Seconds(10)).status(), "kill");
  std::fprintf(stderr, "killed server-%d at %.1f s\n", index,
               absl::ToDoubleSeconds(killed - start));
  absl::SleepFor(start + run / 2 - absl::Now());
  const absl::Time restarted = absl::Now();
  Check((*cluster)->RestartServer(index), "restart");
  std::fprintf(stderr, "restarted server-%d at %.1f s\n", index,
               absl::ToDoubleSeconds(restarted - start));
  // When the restarted server holds a full copy of every range again.
  absl::Time caught_up = absl::InfiniteFuture();
  while (absl::Now() < stop + absl::Seconds(30)) {
    auto m = sched.GetClusterMap();
    bool in_sync = m.ok();
    if (m.ok()) {
      NodeId id = kNoNode;
      for (const auto& n : m->nodes()) {
        if (n.name() == absl::StrCat("server-", index)) id = n.id();
      }
      for (const auto& t : m->tables()) {
        for (const auto& r : t.ranges()) {
          in_sync &= r.primary() == id ||
                     std::find(r.replicas().begin(), r.replicas().end(), id) !=
                         r.replicas().end();
        }
      }
    }
    if (in_sync) {
      caught_up = absl::Now();
      break;
    }
    absl::SleepFor(absl::Milliseconds(20));
  }
  for (auto& t : threads) t.join();

  auto rate = [&](absl::Time from, absl::Time to) {
    const int a =
        std::max<int>(0, absl::ToInt64Milliseconds(from - start) / 100);
    const int b =
        std::min<int>(slots, absl::ToInt64Milliseconds(to - start) / 100);
    uint64_t sum = 0;
    for (int i = a; i < b; ++i) sum += acked[i].load();
    return b > a ? sum / ((b - a) / 10.0) : 0.0;
  };
  std::printf(
      "# soak_bench (%s): %d clients x %d in flight, %d threads, "
      "--replicas=%d, --balance_primaries=%s, 2 servers, %.0f s\n\n",
      absl::FormatTime(start).c_str(), n_clients, window, n_threads,
      absl::GetFlag(FLAGS_replicas),
      absl::GetFlag(FLAGS_balance_primaries) ? "true" : "false",
      absl::ToDoubleSeconds(run));
  std::printf(
      "| phase | from (s) | to (s) | acknowledged adds/s "
      "|\n|---|---|---|---|\n");
  auto row = [&](const char* name, absl::Time a, absl::Time b) {
    std::printf("| %s | %.1f | %.1f | %.0f |\n", name,
                absl::ToDoubleSeconds(a - start),
                absl::ToDoubleSeconds(b - start), rate(a, b));
  };
  row("before the kill", start + absl::Seconds(1), killed);
  row("one server dead", killed, restarted);
  const absl::Time after = std::min(caught_up, stop);
  row("restarted, catching up", restarted, after);
  if (after < stop) row("after catch-up", after, stop);
  std::printf(
      "\nlongest wait of a client for an acknowledgement: %.0f ms "
      "(the failover, as the writers saw it)\n",
      longest_wait_us.load() / 1000.0);
  std::printf("restarted server in sync %.1f s after its restart\n",
              caught_up == absl::InfiniteFuture()
                  ? -1.0
                  : absl::ToDoubleSeconds(caught_up - restarted));

  // The exact final state.
  std::vector<float> got(kDenseKeys * kWidth);
  Check((*admin)->GetSync(*dense, Keys::Range(0, kDenseKeys),
                          absl::MakeSpan(got)),
        "read dense");
  std::vector<Key> wire(kSparseKeys);
  for (int i = 0; i < kSparseKeys; ++i) wire[i] = SparseKey(i);
  std::vector<float> got_sparse(kSparseKeys * kWidth);
  Check((*admin)->GetSync(*sparse, wire, absl::MakeSpan(got_sparse)),
        "read sparse");
  uint64_t wrong = 0, total = 0;
  {
    absl::MutexLock lock(&expected.mu);
    for (Key k = 0; k < kDenseKeys; ++k) {
      total += expected.dense[k];
      for (uint32_t j = 0; j < kWidth; ++j) {
        wrong += got[k * kWidth + j] != static_cast<float>(expected.dense[k]);
      }
    }
    for (int i = 0; i < kSparseKeys; ++i) {
      total += expected.sparse[i];
      for (uint32_t j = 0; j < kWidth; ++j) {
        wrong += got_sparse[i * kWidth + j] !=
                 static_cast<float>(expected.sparse[i]);
      }
    }
  }
  std::printf(
      "final state: %llu acknowledged row adds, %llu floats wrong, "
      "%d adds failed\n",
      static_cast<unsigned long long>(total),
      static_cast<unsigned long long>(wrong), failures.load());
  clients.clear();
  admin->reset();
  Check((*cluster)->Stop(), "stop cluster");
  return wrong == 0 && failures.load() == 0 ? 0 : 1;
}

}  // namespace
}  // namespace downpour

int main(int argc, char** argv) {
  downpour::SetUsage(
      "clients writing through a server's kill and restart (usage: "
      "soak_bench [--clients=64] [--seconds=30] [flags])");
  absl::ParseCommandLine(argc, argv);
  return downpour::Main();
}
