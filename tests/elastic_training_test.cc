// A BSP job whose cluster changes shape while it trains: real ps_worker
// processes train the MLP on two servers; a third server joins at clock
// 100 and takes its share of the ranges (scale out), and at clock 200 one
// of the first two is drained and leaves (scale in, exit 0). The job ends
// with exactly the parameters of the same job on an unchanging cluster,
// bit for bit: every step is applied once, on whichever server holds its
// range at the time (held steps are re-sent after a handover). The same
// for a job whose ranges are split under it (scheduler/splits.h): the
// largest table's first range at clock 100, a piece of it at clock 200,
// each cut off the BSP parts' boundaries, and the last two pieces merged
// back at clock 250 (the merged range aggregates its halves' steps apart,
// RangeAssignment.step_cuts).
#include <sys/wait.h>

#include <iostream>

#include "absl/strings/str_cat.h"
#include "client/client.h"
#include "cluster/scheduler_client.h"
#include "common/test_util.h"
#include "launch/local_cluster.h"
#include "launch/local_job.h"
#include "models/model.h"
#include "tests/cluster_fixture.h"
#include "tests/model_params.h"

namespace downpour {
namespace {

constexpr int kSteps = 300;

struct JobRun {
  std::vector<float> params;
  int64_t joined_at = -1;   // gating clock once the new server held ranges
  int64_t drained_at = -1;  // gating clock once the drained one had left
  std::vector<int64_t> split_at;  // gating clocks once each split was done
  int64_t merged_at = -1;         // gating clock once the merge was done
};

// What happens to the cluster while the job trains.
enum class Change { kNone, kScaleOutAndDrain, kSplits };

// The table with the most keys, and the key in the middle of its first
// range, nudged off any round number (0: none).
std::pair<std::string, Key> SplitPoint(const proto::ClusterMap& map) {
  const proto::TableMap* largest = nullptr;
  for (const auto& t : map.tables()) {
    if (largest == nullptr ||
        t.spec().num_keys() > largest->spec().num_keys()) {
      largest = &t;
    }
  }
  if (largest == nullptr) return {"", 0};
  const proto::RangeAssignment& r = largest->ranges(0);
  if (r.end() - r.begin() < 8) return {"", 0};
  return {largest->spec().name(), r.begin() + (r.end() - r.begin()) / 2 + 3};
}

// Ranges `name` holds (-1: not in the map).
int Held(const proto::ClusterMap& map, const std::string& name) {
  const proto::NodeInfo* n = NodeNamed(map, name);
  return n == nullptr ? -1 : RangesHeldBy(map, n->id());
}

bool NoMoves(const proto::ClusterMap& map) {
  for (const auto& t : map.tables()) {
    for (const auto& r : t.ranges()) {
      if (r.move_to() != kNoNode || r.handing_to() != kNoNode ||
          r.catching_up_size() > 0) {
        return false;
      }
    }
  }
  return true;
}

// Polls until `pred(map, gating clock)`; returns the gating clock then, -1
// after `timeout`.
int64_t AwaitJob(
    SchedulerClient& sched, absl::Duration timeout,
    const std::function<bool(const proto::ClusterMap&, int64_t)>& pred) {
  const absl::Time deadline = absl::Now() + timeout;
  while (absl::Now() < deadline) {
    auto map = sched.GetClusterMap();
    auto status = sched.GetJobStatus();
    if (map.ok() && status.ok() && pred(*map, status->gating_clock())) {
      return status->gating_clock();
    }
    absl::SleepFor(absl::Milliseconds(5));
  }
  return -1;
}

JobRun Train(const std::string& tag, int replicas, Change change) {
  JobRun run;
  const std::string dir = TestTmpDir() + "/" + tag;
  EXPECT_EQ(system(("rm -rf " + dir + " && mkdir -p " + dir).c_str()), 0);
  LocalJobOptions o;
  o.cluster.bin_dir = RunfilePath("");
  o.cluster.work_dir = dir;
  o.cluster.num_servers = 2;
  o.cluster.scheduler_flags = {"--consistency=bsp", "--num_workers=2",
                               absl::StrCat("--replicas=", replicas),
                               "--ranges_per_table=4"};
  // The merge below removes a boundary made a moment before: these
  // workers' pushes are BSP steps, idempotent by rank and clock, not
  // writes a young boundary could make count twice.
  if (change == Change::kSplits) {
    o.cluster.scheduler_flags.push_back("--merge_min_age_s=0");
  }
  o.workers.assign(
      2, {"--model=mlp", absl::StrCat("--steps=", kSteps), "--batch=32",
          "--seed=7", "--eval_every=100000", "--lr=0.05", "--warmup_steps=5"});
  auto job = LocalJob::Start(o);
  EXPECT_OK(job);
  if (!job.ok()) return run;
  LocalCluster& cluster = (*job)->cluster();
  SchedulerClient sched((*job)->scheduler_address());
  for (int i = 1; change == Change::kSplits && i <= 2; ++i) {
    EXPECT_GE(AwaitJob(sched, absl::Seconds(120),
                       [&](const proto::ClusterMap&, int64_t clock) {
                         return clock >= i * kSteps / 3;
                       }),
              0);
    auto map = sched.GetClusterMap();
    EXPECT_OK(map);
    if (!map.ok()) break;
    const auto [table, key] = SplitPoint(*map);
    EXPECT_NE(key, 0u);
    std::cout << "split '" << table << "' at key " << key << std::endl;
    EXPECT_OK(SplitAndAwait(sched, table, key, absl::Seconds(120)));
    run.split_at.push_back(AwaitJob(
        sched, absl::Seconds(120),
        [&, table = table, key = key](const proto::ClusterMap& m, int64_t) {
          const proto::RangeAssignment* r = RangeOf(m, table, key);
          return r != nullptr && r->begin() == key;
        }));
    if (i < 2) continue;
    // The second split's pieces merge back, their steps kept apart.
    EXPECT_GE(AwaitJob(sched, absl::Seconds(120),
                       [&](const proto::ClusterMap&, int64_t clock) {
                         return clock >= 5 * kSteps / 6;
                       }),
              0);
    std::cout << "merge '" << table << "' at key " << key << std::endl;
    EXPECT_OK(MergeAndAwait(sched, table, key, absl::Seconds(120)));
    run.merged_at = AwaitJob(
        sched, absl::Seconds(120),
        [&, table = table, key = key](const proto::ClusterMap& m, int64_t) {
          const proto::RangeAssignment* r = RangeOf(m, table, key);
          return r != nullptr && r->begin() < key && r->step_cuts_size() > 0;
        });
  }
  if (change == Change::kScaleOutAndDrain) {
    EXPECT_GE(AwaitJob(sched, absl::Seconds(120),
                       [](const proto::ClusterMap&, int64_t clock) {
                         return clock >= kSteps / 3;
                       }),
              0);
    EXPECT_OK(cluster.AddServer());
    run.joined_at = AwaitJob(sched, absl::Seconds(120),
                             [](const proto::ClusterMap& m, int64_t) {
                               return Held(m, "server-2") > 0 && NoMoves(m);
                             });
    EXPECT_GE(AwaitJob(sched, absl::Seconds(120),
                       [](const proto::ClusterMap&, int64_t clock) {
                         return clock >= 2 * kSteps / 3;
                       }),
              0);
    proto::DrainRequest drain;
    drain.set_name("server-0");
    EXPECT_OK(sched.Drain(drain).status());
    auto exit = cluster.server(0).Wait(absl::Seconds(120));
    EXPECT_OK(exit);
    if (exit.ok()) {
      EXPECT_TRUE(WIFEXITED(*exit) && WEXITSTATUS(*exit) == 0) << *exit;
    }
    run.drained_at = AwaitJob(sched, absl::Seconds(10),
                              [](const proto::ClusterMap& m, int64_t) {
                                return Held(m, "server-0") == 0;
                              });
  }
  EXPECT_OK((*job)->WaitForWorkers(absl::Seconds(600)));
  ClientOptions co;
  co.scheduler_address = (*job)->scheduler_address();
  auto client = Client::Connect(co);
  EXPECT_OK(client);
  if (!client.ok()) return run;
  auto params = ReadModelParams(**client, *MakeMlp({784, 256, 10}), "mlp");
  EXPECT_OK(params);
  if (!params.ok()) return run;
  run.params = *std::move(params);
  client->reset();
  EXPECT_OK((*job)->Stop());
  return run;
}

void ExpectBitForBit(const JobRun& clean, const JobRun& elastic) {
  ASSERT_FALSE(clean.params.empty());
  EXPECT_EQ(CountDiffering(clean.params, elastic.params), 0u)
      << "of " << clean.params.size() << " parameters";
}

// The job's shape changes inside it, not after it.
void ExpectMidRun(const JobRun& r) {
  std::cout << "server-2 took its ranges by clock " << r.joined_at
            << ", server-0 had left by clock " << r.drained_at << " of "
            << kSteps << std::endl;
  EXPECT_GE(r.joined_at, kSteps / 3);
  EXPECT_LT(r.joined_at, kSteps);
  EXPECT_GE(r.drained_at, 2 * kSteps / 3);
  EXPECT_LT(r.drained_at, kSteps);
}

TEST(ElasticTrainingTest, BspThroughAScaleOutAndADrainEqualsARunWithout) {
  const JobRun clean = Train("clean", 1, Change::kNone);
  const JobRun elastic = Train("elastic", 1, Change::kScaleOutAndDrain);
  ExpectMidRun(elastic);
  ExpectBitForBit(clean, elastic);
}

TEST(ElasticTrainingTest, TheSameWithTwoHoldersPerRange) {
  const JobRun clean = Train("clean-r2", 2, Change::kNone);
  const JobRun elastic = Train("elastic-r2", 2, Change::kScaleOutAndDrain);
  ExpectMidRun(elastic);
  ExpectBitForBit(clean, elastic);
}

TEST(ElasticTrainingTest, BspThroughTwoSplitsAndAMergeEqualsARunWithout) {
  const JobRun clean = Train("clean-split", 2, Change::kNone);
  const JobRun split = Train("split", 2, Change::kSplits);
  ASSERT_EQ(split.split_at.size(), 2u);
  std::cout << "merge done by clock " << split.merged_at << " of " << kSteps
            << std::endl;
  EXPECT_GE(split.merged_at, 5 * kSteps / 6);
  EXPECT_LT(split.merged_at, kSteps);
  for (int64_t clock : split.split_at) {
    std::cout << "split done by clock " << clock << " of " << kSteps
              << std::endl;
    EXPECT_GE(clock, kSteps / 3);
    EXPECT_LT(clock, kSteps);
  }
  ExpectBitForBit(clean, split);
}

}  // namespace
}  // namespace downpour
