// elastic_bench: what moving key ranges costs a running cluster
// (scheduler/moves.h).
//
//   bazel build -c opt //bench:elastic_bench //server:ps_server
//       //scheduler:ps_scheduler    (one line)
//   bazel-bin/bench/elastic_bench [--sections=stall,scaling,zipf]
//
// Sections (each its own local cluster, printed as Markdown tables):
//  - stall: a dense table of two 64 MiB ranges on one server; a probe adds
//    to each range synchronously, back to back, while background writers
//    load the server; a second server joins and one range moves to it (a
//    copy while writes go on, then a handover). Prints how long the copy
//    and the handover took and the longest and 99th-percentile add on the
//    moving range during the move (the goal: under 100 ms), and on the
//    other one.
//  - scaling: writers pushing batches of --scaling_rows random rows to a
//    dense table of 8 ranges (sgd), at 1, then 2, then 4 servers (each
//    added while they write): rows pushed per second at each size, and the
//    CPU of the writers' process and of the servers.
//  - zipf: 4 servers, a sparse table, writers pushing batches of Zipf(1.1)
//    ids (spread over the key space by a bijective mix): the busiest
//    server's load (rows per second it serves as primary) over the mean,
//    with one range per server and no moves (as before issue 23), with 32
//    ranges balanced by bytes (the default), and by load
//    (--balance=load), once the moves have settled; then the same ids
//    unmixed (keys in id order, spread over the key space: the hot ids
//    all in the first of 4 ranges), balanced by load without and with
//    splits (scheduler/splits.h), with the ranges each placement ends with.
// Exits 1 if an operation fails.
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <map>
#include <random>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "client/client.h"
#include "cluster/scheduler_client.h"
#include "cluster/server_admin_client.h"
#include "common/malloc_tuning.h"
#include "common/subprocess.h"
#include "common/usage.h"
#include "launch/local_cluster.h"

ABSL_FLAG(std::string, bin_dir, "",
          "folder with scheduler/ and server/ binaries (default: next to "
          "this binary's folder)");
ABSL_FLAG(std::string, work_dir, "/tmp/elastic_bench", "logs of the daemons");
ABSL_FLAG(std::string, sections, "stall,scaling,zipf",
          "comma-separated: stall, scaling, zipf");
ABSL_FLAG(int, writers, 4, "background writer threads (each its own client)");
ABSL_FLAG(double, seconds, 5, "scaling, zipf: seconds measured per phase");
ABSL_FLAG(std::vector<std::string>, scaling_rows, {"64"},
          "scaling: rows per push, one pass over 1, 2, 4 servers each (a "
          "push is cut into one message per range it touches: 64 rows make "
          "messages of about 8, whose per-message cost the writers' own "
          "process pays)");
ABSL_FLAG(int, range_mb, 64, "stall: MiB per range of the moving table");

namespace downpour {
namespace {

void Check(const absl::Status& s, const char* what) {
  if (!s.ok()) {
    std::fprintf(stderr, "%s: %s\n", what, s.ToString().c_str());
    std::exit(1);
  }
}

std::unique_ptr<LocalCluster> StartCluster(
    int servers, const std::string& name,
    const std::vector<std::string>& scheduler_flags) {
  LocalClusterOptions o;
  o.bin_dir = absl::GetFlag(FLAGS_bin_dir).empty()
                  ? BinDirOfThisProgram()
                  : absl::GetFlag(FLAGS_bin_dir);
  o.work_dir = absl::GetFlag(FLAGS_work_dir) + "/" + name;
  std::system(("rm -rf " + o.work_dir + " && mkdir -p " + o.work_dir).c_str());
  o.num_servers = servers;
  o.scheduler_flags = scheduler_flags;
  auto c = LocalCluster::Start(o);
  Check(c.status(), "start cluster");
  return std::move(*c);
}

std::unique_ptr<Client> Connect(LocalCluster& c) {
  ClientOptions o;
  o.scheduler_address = c.scheduler_address();
  o.op_timeout = absl::Seconds(60);
  auto client = Client::Connect(o);
  Check(client.status(), "connect");
  return std::move(*client);
}

// CPU seconds of every server process of `c` so far.
double ServersCpuSeconds(LocalCluster& c) {
  double total = 0;
  for (int i = 0; i < c.num_servers(); ++i) {
    total += std::max(0.0, ProcessCpuSeconds(c.server(i).pid()));
  }
  return total;
}

bool Settled(const proto::ClusterMap& map) {
  for (const auto& t : map.tables()) {
    for (const auto& r : t.ranges()) {
      if (r.move_to() != 0 || r.handing_to() != 0 || r.catching_up_size() > 0 ||
          r.split_at() != 0 || r.merge() != proto::RangeAssignment::NO_MERGE) {
        return false;
      }
    }
  }
  return true;
}

int LiveServers(const proto::ClusterMap& map) {
  int n = 0;
  for (const auto& node : map.nodes()) {
    n += node.role() == proto::SERVER && node.state() == proto::ALIVE;
  }
  return n;
}

// Adds servers until `want` are alive, then waits until no move is under
// way and every live server holds a range.
void GrowTo(LocalCluster& c, SchedulerClient& sched, int want) {
  while (c.num_servers() < want) Check(c.AddServer(), "add server");
  const absl::Time deadline = absl::Now() + absl::Minutes(5);
  while (absl::Now() < deadline) {
    auto map = sched.GetClusterMap();
    if (map.ok() && LiveServers(*map) >= want && Settled(*map)) {
      std::map<uint64_t, int> held;
      for (const auto& t : map->tables()) {
        for (const auto& r : t.ranges()) ++held[r.primary()];
      }
      if (static_cast<int>(held.size()) >= want) return;
    }
    absl::SleepFor(absl::Milliseconds(20));
  }
  std::fprintf(stderr, "the cluster did not settle at %d servers\n", want);
  std::exit(1);
}

// Background writers: each its own client, `window` pushes in flight of
// `rows` random rows of `table` (dense keys below `keys`, or Zipf ids over
// `zipf` when given), until Stop(). Counts rows acknowledged.
class Writers {
 public:
  Writers(LocalCluster& c, Table table, uint64_t keys, size_t rows,
          const std::vector<Key>* zipf_keys = nullptr,
          const std::vector<double>* zipf_cdf = nullptr)
      : table_(table),
        keys_(keys),
        rows_(rows),
        zipf_keys_(zipf_keys),
        zipf_cdf_(zipf_cdf) {
    for (int i = 0; i < absl::GetFlag(FLAGS_writers); ++i) {
      clients_.push_back(Connect(c));
    }
    for (int i = 0; i < absl::GetFlag(FLAGS_writers); ++i) {
      threads_.emplace_back([this, i] { Run(i); });
    }
  }
  ~Writers() { Stop(); }
  void Stop() {
    stop_ = true;
    for (auto& t : threads_) t.join();
    threads_.clear();
  }
  uint64_t rows() const { return acked_.load(); }

 private:
  void Run(int i) {
    Client& client = *clients_[i];
    std::mt19937_64 rng(1000 + i);
    constexpr int kWindow = 4;
    struct Slot {
      Ticket t = 0;
      bool busy = false;
      std::vector<Key> keys;
      std::vector<float> values;
    };
    std::vector<Slot> slots(kWindow);
    std::uniform_real_distribution<double> u(
        0, zipf_cdf_ != nullptr ? zipf_cdf_->back() : 1.0);
    for (uint64_t n = 0; !stop_.load(); ++n) {
      Slot& s = slots[n % kWindow];
      if (s.busy) {
        Check(client.Wait(s.t, absl::Seconds(60)), "background push");
        acked_ += s.keys.size();
      }
      s.keys.resize(rows_);
      for (Key& k : s.keys) {
        if (zipf_cdf_ != nullptr) {
          const size_t rank =
              std::lower_bound(zipf_cdf_->begin(), zipf_cdf_->end(), u(rng)) -
              zipf_cdf_->begin();
          k = (*zipf_keys_)[std::min(rank, zipf_keys_->size() - 1)];
        } else {
          k = rng() % keys_;
        }
      }
      s.values.assign(rows_ * table_.width, 0.001f);
      s.t = client.Push(table_, s.keys, s.values);
      s.busy = true;
    }
    for (Slot& s : slots) {
      if (s.busy) Check(client.Wait(s.t, absl::Seconds(60)), "push");
    }
  }

  const Table table_;
  const uint64_t keys_;
  const size_t rows_;
  const std::vector<Key>* zipf_keys_;
  const std::vector<double>* zipf_cdf_;
  std::vector<std::unique_ptr<Client>> clients_;
  std::vector<std::thread> threads_;
  std::atomic<bool> stop_{false};
  std::atomic<uint64_t> acked_{0};
};

// One range's probe: back-to-back synchronous adds to 16 of its rows, each
// timed.
class Probe {
 public:
  Probe(LocalCluster& c, Table table, Key begin)
      : client_(Connect(c)), table_(table), begin_(begin) {
    thread_ = std::thread([this] { Run(); });
  }
  ~Probe() { Stop(); }
  void Stop() {
    stop_ = true;
    if (thread_.joinable()) thread_.join();
  }
  // Latencies of the adds sent in [from, to].
  std::vector<absl::Duration> Between(absl::Time from, absl::Time to) {
    absl::MutexLock lock(&mu_);
    std::vector<absl::Duration> out;
    for (const auto& [sent, took] : adds_) {
      if (sent >= from && sent <= to) out.push_back(took);
    }
    return out;
  }

 private:
  void Run() {
    std::vector<float> v(16 * table_.width, 1.0f);
    while (!stop_.load()) {
      const absl::Time sent = absl::Now();
      Check(client_->AddSync(table_, Keys::Range(begin_, begin_ + 16), v),
            "probe add");
      absl::MutexLock lock(&mu_);
      adds_.push_back({sent, absl::Now() - sent});
    }
  }

  std::unique_ptr<Client> client_;
  const Table table_;
  const Key begin_;
  std::thread thread_;
  std::atomic<bool> stop_{false};
  absl::Mutex mu_;
  std::vector<std::pair<absl::Time, absl::Duration>> adds_ ABSL_GUARDED_BY(mu_);
};

std::string Ms(absl::Duration d) {
  return absl::StrFormat("%.1f", absl::ToDoubleMilliseconds(d));
}

void Summary(const char* name, std::vector<absl::Duration> l) {
  if (l.empty()) {
    std::printf("| %s | 0 | - | - | - |\n", name);
    return;
  }
  std::sort(l.begin(), l.end());
  std::printf("| %s | %zu | %s | %s | %s |\n", name, l.size(),
              Ms(l[l.size() / 2]).c_str(),
              Ms(l[std::min(l.size() - 1, l.size() * 99 / 100)]).c_str(),
              Ms(l.back()).c_str());
}

void StallSection() {
  const uint64_t range_rows =
      (static_cast<uint64_t>(absl::GetFlag(FLAGS_range_mb)) << 20) / (64 * 4);
  auto cluster =
      StartCluster(1, "stall", {"--ranges_per_table=2", "--max_range_moves=1"});
  auto client = Connect(*cluster);
  SchedulerClient sched(cluster->scheduler_address());
  TableOptions o;
  o.name = "big";
  o.width = 64;
  o.num_keys = 2 * range_rows;
  o.handler = "sum";
  auto table = client->CreateTable(o);
  Check(table.status(), "create table");
  std::printf(
      "\n## A %d MiB range moving under writes (1 -> 2 servers, %d "
      "background writers)\n\n",
      absl::GetFlag(FLAGS_range_mb), absl::GetFlag(FLAGS_writers));
  auto background =
      std::make_unique<Writers>(*cluster, *table, 2 * range_rows, 64);
  auto first = std::make_unique<Probe>(*cluster, *table, 0);
  auto second = std::make_unique<Probe>(*cluster, *table, range_rows);
  absl::SleepFor(absl::Seconds(1));
  Check(cluster->AddServer(), "add server");
  // The steps as the map shows them, polled every 2 ms.
  absl::Time started, copied, handing, done;
  Key moving = 0;
  const absl::Time deadline = absl::Now() + absl::Minutes(5);
  while (absl::Now() < deadline) {
    auto map = sched.GetClusterMap();
    const absl::Time now = absl::Now();
    if (!map.ok() || map->tables_size() == 0) continue;
    bool any = false;
    for (const auto& r : map->tables(0).ranges()) {
      if (r.move_to() == 0) continue;
      any = true;
      moving = r.begin();
      if (started == absl::Time()) started = now;
      if (copied == absl::Time() &&
          std::find(r.replicas().begin(), r.replicas().end(), r.move_to()) !=
              r.replicas().end()) {
        copied = now;
      }
      if (handing == absl::Time() && r.handing_to() == r.move_to()) {
        handing = now;
      }
    }
    if (started != absl::Time() && !any && Settled(*map)) {
      done = now;
      break;
    }
    absl::SleepFor(absl::Milliseconds(2));
  }
  if (done == absl::Time()) {
    std::fprintf(stderr, "the range did not move\n");
    std::exit(1);
  }
  absl::SleepFor(absl::Milliseconds(500));
  first->Stop();
  second->Stop();
  background.reset();
  std::printf("| step | ms |\n|---|---|\n");
  std::printf(
      "| copy (map lists the target, until it is in sync) | %s |\n",
      Ms((copied != absl::Time() ? copied : handing) - started).c_str());
  std::printf("| handover (writes refused, until the new map) | %s |\n",
              handing == absl::Time() ? "-" : Ms(done - handing).c_str());
  std::printf("| whole move | %s |\n\n", Ms(done - started).c_str());
  std::printf(
      "| adds sent during the move | count | p50 ms | p99 ms | longest ms "
      "|\n|---|---|---|---|---|\n");
  Probe& mover = moving == 0 ? *first : *second;
  Probe& other = moving == 0 ? *second : *first;
  Summary("to the moving range", mover.Between(started, done));
  Summary("to the other range", other.Between(started, done));
  std::fflush(stdout);
  first.reset();
  second.reset();
  client.reset();
  Check(cluster->Stop(), "stop cluster");
}

void ScalingSection() {
  TableOptions o;
  o.name = "w";
  o.width = 64;
  o.num_keys = 8 * 32768;
  o.handler = "sgd";
  std::printf(
      "\n## Throughput as servers join (%d writers, pushes of width 64, 8 "
      "ranges)\n\n| rows a push | servers | rows pushed/s | MB/s | CPU "
      "cores, writers' process / servers |\n|---|---|---|---|---|\n",
      absl::GetFlag(FLAGS_writers));
  const absl::Duration phase = absl::Seconds(absl::GetFlag(FLAGS_seconds));
  // Servers are only ever added, so each pass starts from a fresh cluster
  // of one.
  for (const std::string& r : absl::GetFlag(FLAGS_scaling_rows)) {
    size_t rows = 0;
    if (!absl::SimpleAtoi(r, &rows) || rows == 0 || rows > o.num_keys) {
      std::fprintf(stderr, "--scaling_rows: '%s' is not in [1, %llu]\n",
                   r.c_str(), static_cast<unsigned long long>(o.num_keys));
      std::exit(1);
    }
    auto cluster = StartCluster(1, "scaling", {"--ranges_per_table=8"});
    auto client = Connect(*cluster);
    SchedulerClient sched(cluster->scheduler_address());
    auto table = client->CreateTable(o);
    Check(table.status(), "create table");
    auto writers =
        std::make_unique<Writers>(*cluster, *table, o.num_keys, rows);
    for (int servers : {1, 2, 4}) {
      GrowTo(*cluster, sched, servers);
      absl::SleepFor(absl::Milliseconds(500));
      const uint64_t a = writers->rows();
      const double self0 = ProcessCpuSeconds(getpid());
      const double servers0 = ServersCpuSeconds(*cluster);
      const absl::Time t0 = absl::Now();
      absl::SleepFor(phase);
      const double secs = absl::ToDoubleSeconds(absl::Now() - t0);
      const double rate = (writers->rows() - a) / secs;
      std::printf("| %zu | %d | %.0f | %.0f | %.1f / %.1f |\n", rows, servers,
                  rate, rate * 64 * 4 / 1e6,
                  (ProcessCpuSeconds(getpid()) - self0) / secs,
                  (ServersCpuSeconds(*cluster) - servers0) / secs);
      std::fflush(stdout);
    }
    writers.reset();
    client.reset();
    Check(cluster->Stop(), "stop cluster");
  }
}

// Rows each live server served as primary, summed over its ranges.
std::map<uint64_t, uint64_t> PrimaryRows(LocalCluster& c,
                                         SchedulerClient& sched) {
  std::map<uint64_t, uint64_t> out;
  auto map = sched.GetClusterMap();
  Check(map.status(), "map");
  for (const auto& n : map->nodes()) {
    if (n.role() != proto::SERVER || n.state() != proto::ALIVE) continue;
    ServerAdminClient admin(n.admin_address());
    auto stats = admin.GetStats(absl::Seconds(5));
    Check(stats.status(), "stats");
    uint64_t rows = 0;
    for (const auto& r : stats->ranges()) rows += r.keys();
    out[n.id()] = rows;
  }
  return out;
}

// The busiest server's rows per second over the mean, over `phase`.
double Imbalance(LocalCluster& c, SchedulerClient& sched,
                 absl::Duration phase) {
  // Ranges may change primary between the samples only if moves run; the
  // caller waits for them to settle first.
  auto a = PrimaryRows(c, sched);
  absl::SleepFor(phase);
  auto b = PrimaryRows(c, sched);
  double total = 0, most = 0;
  for (const auto& [id, rows] : b) {
    const double d = rows >= a[id] ? rows - a[id] : rows;
    total += d;
    most = std::max(most, d);
  }
  return b.empty() || total == 0 ? 0 : most / (total / b.size());
}

void ZipfSection() {
  constexpr uint64_t kIds = 1'000'000;
  std::vector<double> cdf(kIds);
  double sum = 0;
  for (uint64_t i = 0; i < kIds; ++i) {
    cdf[i] = (sum += 1.0 / std::pow(i + 1.0, 1.1));
  }
  std::vector<Key> keys(kIds), in_order(kIds);
  for (uint64_t i = 0; i < kIds; ++i) {
    keys[i] = i * 0x9E3779B97F4A7C15ull % kKeySpaceEnd;
    in_order[i] = i * (kKeySpaceEnd / kIds);
  }
  std::printf(
      "\n## Load with Zipf(1.1) ids (4 servers, sparse table, %d writers, "
      "256-id pushes)\n\n| placement | busiest server / mean (rows/s as "
      "primary) | ranges | map epoch |\n|---|---|---|---|\n",
      absl::GetFlag(FLAGS_writers));
  const absl::Duration phase = absl::Seconds(absl::GetFlag(FLAGS_seconds));
  struct Placement {
    const char* name;
    std::vector<std::string> flags;
    const std::vector<Key>* keys;
  };
  const Placement placements[] = {
      {"mixed ids, one range per server (before issue 23)",
       {"--rebalance=false"},
       &keys},
      {"mixed ids, 32 ranges, --balance=bytes",
       {"--ranges_per_table=32"},
       &keys},
      {"mixed ids, 32 ranges, --balance=load",
       {"--ranges_per_table=32", "--balance=load", "--split_hot_ranges=false"},
       &keys},
      {"ids in order, 4 ranges, --balance=load, no splits",
       {"--balance=load", "--split_hot_ranges=false"},
       &in_order},
      {"ids in order, 4 ranges, --balance=load with splits",
       {"--balance=load"},
       &in_order}};
  for (const Placement& p : placements) {
    auto cluster = StartCluster(4, "zipf", p.flags);
    auto client = Connect(*cluster);
    SchedulerClient sched(cluster->scheduler_address());
    TableOptions o;
    o.name = "emb";
    o.sparse = true;
    o.width = 16;
    o.handler = "sgd";
    auto table = client->CreateTable(o);
    Check(table.status(), "create table");
    auto writers =
        std::make_unique<Writers>(*cluster, *table, 0, 256, p.keys, &cdf);
    // Loads are measured from the servers' reports (about once a second),
    // and a range's load needs two of them after each change before it
    // splits again; moves and splits go on until no server is over the
    // mean by more than 10% (30% for splits). Wait until nothing has
    // changed for six seconds (at most three minutes).
    absl::Time quiet_since = absl::Now();
    uint64_t last_epoch = 0;
    int ranges = 0;
    const absl::Time deadline = absl::Now() + absl::Minutes(3);
    while (absl::Now() < deadline &&
           absl::Now() - quiet_since < absl::Seconds(6)) {
      auto map = sched.GetClusterMap();
      if (map.ok() && (map->epoch() != last_epoch || !Settled(*map))) {
        last_epoch = map->epoch();
        quiet_since = absl::Now();
        ranges = map->tables_size() > 0 ? map->tables(0).ranges_size() : 0;
      }
      absl::SleepFor(absl::Milliseconds(50));
    }
    const double imbalance = Imbalance(*cluster, sched, phase);
    writers.reset();
    std::printf("| %s | %.2f | %d | epoch %llu |\n", p.name, imbalance, ranges,
                static_cast<unsigned long long>(last_epoch));
    std::fflush(stdout);
    client.reset();
    Check(cluster->Stop(), "stop cluster");
  }
}

int Main() {
  TuneAllocatorForLargeMessages();
  for (absl::string_view s :
       absl::StrSplit(absl::GetFlag(FLAGS_sections), ',')) {
    if (s == "stall") {
      StallSection();
    } else if (s == "scaling") {
      ScalingSection();
    } else if (s == "zipf") {
      ZipfSection();
    } else {
      std::fprintf(stderr, "unknown section '%s'\n", std::string(s).c_str());
      return 2;
    }
  }
  return 0;
}

}  // namespace
}  // namespace downpour

int main(int argc, char** argv) {
  downpour::SetUsage(
      "what moving key ranges costs a running cluster (usage: elastic_bench "
      "[--sections=stall,scaling,zipf] [flags])");
  absl::ParseCommandLine(argc, argv);
  return downpour::Main();
}
