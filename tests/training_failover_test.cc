// Training through a server failure: ps_scheduler --replicas=2, three
// ps_server and real ps_worker processes; one server is killed with
// SIGKILL in the middle of the job.
//  - BSP (the MLP): the job finishes, and its final parameters equal those
//    of the same job without the kill, bit for bit (the steps the killed
//    primary held are re-sent to the promoted backup and applied exactly
//    once).
//  - ASP: the job goes on and reaches the usual accuracy.
#include <signal.h>
#include <sys/wait.h>

#include <map>

#include "absl/strings/str_cat.h"
#include "client/client.h"
#include "cluster/scheduler_client.h"
#include "common/test_util.h"
#include "launch/local_cluster.h"
#include "launch/local_job.h"
#include "models/dataset.h"
#include "models/model.h"
#include "tests/model_params.h"

namespace downpour {
namespace {

constexpr char kData[] = "/usr/share/datasets/fashion-mnist";

std::unique_ptr<Model> MakeModel(const std::string& name) {
  return name == "mlp" ? MakeMlp({784, 256, 10})
                       : MakeSoftmaxRegression(784, 10);
}

struct JobRun {
  std::vector<float> params;
  int killed = -1;         // server index, or -1
  int64_t killed_at = -1;  // the gating clock when it was killed
  // With a restart: the gating clock when every table's primaries were
  // spread over both servers again (-1: they were not).
  int64_t balanced_at = -1;
};

// Whether every range is replicated in sync, no handover is under way, and
// each table's ranges have their primaries spread as evenly as they can
// be over the live servers.
bool PrimariesBalanced(const proto::ClusterMap& map) {
  int live = 0;
  for (const auto& n : map.nodes()) {
    live += n.role() == proto::SERVER && n.state() == proto::ALIVE;
  }
  if (map.tables_size() == 0 || live == 0) return false;
  for (const auto& t : map.tables()) {
    std::map<NodeId, int> primaries;
    for (const auto& r : t.ranges()) {
      if (r.handing_to() != kNoNode || r.replicas_size() != 1 ||
          r.catching_up_size() != 0) {
        return false;
      }
      ++primaries[r.primary()];
    }
    const int ranges = t.ranges_size();
    for (const auto& [node, count] : primaries) {
      if (count > (ranges + live - 1) / live) return false;
    }
  }
  return true;
}

// Trains `steps` steps of `model` with `workers` workers on `servers`
// servers; with `kill`, kills the primary of the first table's first range
// once the job has passed a third of its steps, and with `restart` starts
// it again at once and waits for the primaries to be spread again.
JobRun TrainJob(const std::string& tag, const std::string& model,
                const std::string& consistency, int workers, int steps,
                bool kill, int servers = 3, bool restart = false) {
  JobRun run;
  const std::string dir = TestTmpDir() + "/" + tag;
  EXPECT_EQ(system(("mkdir -p " + dir).c_str()), 0);
  LocalJobOptions o;
  o.cluster.bin_dir = RunfilePath("");
  o.cluster.work_dir = dir;
  o.cluster.num_servers = servers;
  o.cluster.scheduler_flags = {"--consistency=" + consistency, "--replicas=2",
                               absl::StrCat("--num_workers=", workers)};
  o.workers.assign(
      workers,
      {"--model=" + model, absl::StrCat("--steps=", steps), "--batch=32",
       "--seed=7", "--eval_every=100000", "--lr=0.05", "--warmup_steps=5"});
  auto job = LocalJob::Start(o);
  EXPECT_OK(job);
  if (!job.ok()) return run;
  LocalCluster& cluster = (*job)->cluster();
  SchedulerClient sched((*job)->scheduler_address());
  if (kill) {
    const absl::Time deadline = absl::Now() + absl::Seconds(120);
    while (absl::Now() < deadline) {
      auto status = sched.GetJobStatus();
      if (status.ok() && status->gating_clock() >= steps / 3) {
        run.killed_at = status->gating_clock();
        break;
      }
      absl::SleepFor(absl::Milliseconds(5));
    }
    auto map = sched.GetClusterMap();
    EXPECT_OK(map);
    if (map.ok() && map->tables_size() > 0) {
      const NodeId primary = map->tables(0).ranges(0).primary();
      for (const auto& n : map->nodes()) {
        if (n.id() == primary) run.killed = std::stoi(n.name().substr(7));
      }
    }
    EXPECT_GE(run.killed, 0);
    if (run.killed >= 0) {
      cluster.server(run.killed).Signal(SIGKILL);
      EXPECT_OK(cluster.server(run.killed).Wait(absl::Seconds(10)));
    }
    if (restart && run.killed >= 0) {
      EXPECT_OK(cluster.RestartServer(run.killed));
      const absl::Time until = absl::Now() + absl::Seconds(60);
      while (absl::Now() < until) {
        auto m = sched.GetClusterMap();
        auto status = sched.GetJobStatus();
        if (m.ok() && status.ok() && PrimariesBalanced(*m)) {
          run.balanced_at = status->gating_clock();
          break;
        }
        absl::SleepFor(absl::Milliseconds(5));
      }
    }
  }
  // Every worker exits with status 0 (the error names the one that did
  // not, with its log).
  EXPECT_OK((*job)->WaitForWorkers(absl::Seconds(300) * workers));
  ClientOptions co;
  co.scheduler_address = (*job)->scheduler_address();
  auto client = Client::Connect(co);
  EXPECT_OK(client);
  if (!client.ok()) return run;
  auto params = ReadModelParams(**client, *MakeModel(model), model);
  EXPECT_OK(params);
  if (!params.ok()) return run;
  run.params = *std::move(params);
  client->reset();
  EXPECT_OK((*job)->Stop());
  return run;
}

double TestAccuracy(const std::string& model,
                    const std::vector<float>& params) {
  auto test = LoadFashionMnist(kData, false);
  EXPECT_OK(test);
  if (!test.ok()) return 0;
  return MakeModel(model)->Evaluate(params.data(), *test).first;
}

TEST(TrainingFailoverTest, BspWithAKilledServerEqualsARunWithoutBitForBit) {
  // The MLP: its first layer is pushed in several parts per step, each
  // aggregated on its own (and failed over on its own).
  constexpr int kSteps = 300;
  const JobRun clean = TrainJob("bsp-clean", "mlp", "bsp", 2, kSteps, false);
  const JobRun killed = TrainJob("bsp-killed", "mlp", "bsp", 2, kSteps, true);
  ASSERT_FALSE(clean.params.empty());
  ASSERT_EQ(killed.params.size(), clean.params.size());
  EXPECT_GE(killed.killed, 0);
  std::cout << "killed server-" << killed.killed << " at clock "
            << killed.killed_at << " of " << kSteps << std::endl;
  EXPECT_EQ(CountDiffering(clean.params, killed.params), 0u)
      << "of " << clean.params.size() << " parameters";
  const double accuracy = TestAccuracy("mlp", killed.params);
  std::cout << "BSP test accuracy after the kill: " << accuracy << std::endl;
  EXPECT_GT(accuracy, 0.7);
}

// Two servers: the killed one comes back, catches up as the backup of
// every range, and is handed half the primaries back while the workers
// train (its first pushes are refused during each handover and re-sent;
// held steps are re-sent to the new primary). Still bit for bit.
TEST(TrainingFailoverTest, BspThroughAKillAndARestartEqualsARunWithout) {
  constexpr int kSteps = 300;
  const JobRun clean =
      TrainJob("bsp2-clean", "mlp", "bsp", 2, kSteps, false, 2);
  const JobRun restarted =
      TrainJob("bsp2-restarted", "mlp", "bsp", 2, kSteps, true, 2, true);
  ASSERT_FALSE(clean.params.empty());
  ASSERT_EQ(restarted.params.size(), clean.params.size());
  std::cout << "killed server-" << restarted.killed << " at clock "
            << restarted.killed_at << ", restarted; primaries balanced at "
            << "clock " << restarted.balanced_at << " of " << kSteps
            << std::endl;
  // The handovers came while the job ran, not after it.
  EXPECT_GE(restarted.balanced_at, restarted.killed_at);
  EXPECT_LT(restarted.balanced_at, kSteps);
  EXPECT_EQ(CountDiffering(clean.params, restarted.params), 0u)
      << "of " << clean.params.size() << " parameters";
}

TEST(TrainingFailoverTest, AspGoesOnThroughAKilledServer) {
  const JobRun killed = TrainJob("asp-killed", "softmax", "asp", 2, 600, true);
  ASSERT_FALSE(killed.params.empty());
  const double accuracy = TestAccuracy("softmax", killed.params);
  std::cout << "ASP: killed server-" << killed.killed << " at clock "
            << killed.killed_at << "; test accuracy " << accuracy << std::endl;
  EXPECT_GT(accuracy, 0.75);
}

}  // namespace
}  // namespace downpour
