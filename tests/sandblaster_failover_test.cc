// Sandblaster L-BFGS through the loss of a server: the real scheduler,
// servers, coordinator (ps_lbfgs) and workers (ps_worker --job=lbfgs).
//  - With --replicas=2 the job goes on through a primary's kill -9 and
//    follows the single-process run as closely as an undisturbed job does
//    (the vector commands and task adds a failover interrupts are retried
//    and applied exactly once).
//  - A coordinator killed mid-run and started again resumes from the last
//    checkpoint it took, and the job ends as the uninterrupted one does,
//    bit for bit.
//  - With --replicas=1 the range has no other copy: the coordinator and the
//    workers stop within seconds, naming the dead server, instead of
//    waiting out their timeouts.
#include <signal.h>

#include <cmath>
#include <cstdlib>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "cluster/scheduler_client.h"
#include "common/random.h"
#include "common/test_util.h"
#include "lbfgs/coordinator.h"
#include "testing/sandblaster_job.h"

namespace downpour {
namespace {

proto::SandblasterProblem Softmax() {
  proto::SandblasterProblem spec;
  spec.set_kind("softmax");
  spec.set_data_path("/usr/share/datasets/fashion-mnist");
  return spec;
}

std::vector<double> Reference(int iterations) {
  auto problem = TaskProblem::Load(Softmax());
  EXPECT_OK(problem);
  if (!problem.ok()) return {};
  LbfgsOptions o;
  o.max_iterations = iterations;
  std::vector<double> f;
  auto r = RunLocalLbfgs(**problem, o, 32, [&](const IterationRecord& rec) {
    f.push_back(rec.f);
  });
  EXPECT_OK(r);
  return f;
}

// Lines in the job's trace so far (one per iteration, plus a header).
int TraceLines(const std::string& dir) {
  std::ifstream in(dir + "/trace.csv");
  int n = 0;
  std::string line;
  while (std::getline(in, line)) ++n;
  return n;
}

// Waits (at most a minute) until `path` gains a line holding `text`.
void WaitForLogLine(const std::string& path, const std::string& text) {
  std::ifstream in(path);
  in.seekg(0, std::ios::end);
  std::string line, partial;
  const absl::Time deadline = absl::Now() + absl::Minutes(1);
  while (absl::Now() < deadline) {
    while (std::getline(in, line)) {
      if (in.eof()) {  // a line still being written
        partial += line;
        break;
      }
      if ((partial + line).find(text) != std::string::npos) return;
      partial.clear();
    }
    in.clear();
    absl::SleepFor(absl::Milliseconds(2));
  }
}

// Kills the primary of the table's first range with SIGKILL once the job
// has done `after` iterations; records when.
struct Killer {
  std::string dir;
  int after;
  absl::Time killed = absl::InfinitePast();
  void operator()(LocalCluster* cluster) {
    const absl::Time deadline = absl::Now() + absl::Minutes(3);
    while (TraceLines(dir) < after + 2 && absl::Now() < deadline) {
      absl::SleepFor(absl::Milliseconds(10));
    }
    SchedulerClient sched(cluster->scheduler_address());
    auto map = sched.GetClusterMap();
    ASSERT_OK(map);
    ASSERT_GT(map->tables_size(), 0);
    const NodeId primary = map->tables(0).ranges(0).primary();
    int index = -1;
    for (const auto& n : map->nodes()) {
      if (n.id() == primary) index = std::stoi(n.name().substr(7));
    }
    ASSERT_GE(index, 0);
    if (const char* text = std::getenv("KILL_ON_LOG")) {
      // Diagnosis: kill once the primary logs a line holding `text` (with
      // its --v=2 traces: a given vector command or task ADD applied).
      WaitForLogLine(absl::StrCat(dir, "/server-", index, ".log"), text);
    }
    if (const char* j = std::getenv("KILL_JITTER_MS")) {
      const uint64_t seed = absl::ToUnixNanos(absl::Now());
      absl::SleepFor(
          absl::Milliseconds(Uniform01(SplitMix64(seed)) * std::atoi(j)));
    }
    killed = absl::Now();
    cluster->server(index).Signal(SIGKILL);
    EXPECT_OK(cluster->server(index).Wait(absl::Seconds(10)));
    std::cout << "killed server-" << index << " (node " << primary
              << ") after iteration " << after << std::endl;
  }
};

TEST(SandblasterFailoverTest, GoesOnThroughAKilledServerWithReplicas) {
  constexpr int kIterations = 30;
  const std::vector<double> ref = Reference(kIterations);
  ASSERT_EQ(ref.size(), kIterations + 1u);
  SandblasterJobOptions o;
  o.bin_dir = RunfilePath("");
  // Kept with the test's outputs: the servers trace every task ADD and
  // vector command they apply, drop or answer as a retry, and the workers
  // every resend, so that a run off its reference can be followed.
  o.work_dir = TestOutputDir() + "/replicated";
  o.num_servers = 3;
  o.scheduler_flags = {"--replicas=2"};
  o.server_flags = {"--v=2"};
  o.coordinator_flags = {absl::StrCat("--max_iterations=", kIterations),
                         "--table=replicated", "--v=1"};
  o.workers = {{"--v=1"}, {"--v=1"}, {"--v=1"}};
  Killer killer{o.work_dir, 8};
  o.while_running = [&](LocalCluster* c) { killer(c); };
  ASSERT_OK_AND_ASSIGN(SandblasterJobResult run, RunSandblasterJob(o));
  ASSERT_EQ(run.f.size(), kIterations + 1u) << "stop: " << run.summary["stop"];
  for (int k = 0; k <= kIterations; ++k) {
    std::cout << "iteration " << k << ": f " << run.f[k] << ", off by "
              << std::abs(run.f[k] - ref[k]) / std::abs(ref[k]) << " relative"
              << std::endl;
  }
  for (int k = 0; k <= 10; ++k) {
    EXPECT_NEAR(run.f[k], ref[k], 1e-5 * std::abs(ref[k])) << "iteration " << k;
  }
  EXPECT_NEAR(run.f[kIterations], ref[kIterations],
              1e-2 * std::abs(ref[kIterations]));
  for (int code : run.worker_exit_codes) EXPECT_EQ(code, 0);
}

TEST(SandblasterFailoverTest, WithoutReplicasALostServerStopsTheJobAtOnce) {
  SandblasterJobOptions o;
  o.bin_dir = RunfilePath("");
  o.work_dir = TestTmpDir() + "/unreplicated";
  o.num_servers = 2;
  o.coordinator_flags = {"--max_iterations=200", "--table=unreplicated"};
  o.workers = {{}, {}};
  o.allow_failure = true;
  Killer killer{o.work_dir, 5};
  o.while_running = [&](LocalCluster* c) { killer(c); };
  ASSERT_OK_AND_ASSIGN(SandblasterJobResult run, RunSandblasterJob(o));
  const absl::Time ended = absl::Now();
  EXPECT_NE(run.coordinator_exit_code, 0);
  EXPECT_THAT(run.coordinator_log, ::testing::HasSubstr("dead"));
  EXPECT_THAT(run.coordinator_log, ::testing::HasSubstr("server"));
  // Within seconds of the kill (the workers are waited for too), not after
  // the evaluation timeout.
  EXPECT_LT(ended - killer.killed, absl::Seconds(40));
  std::cout << "the job stopped "
            << absl::ToDoubleSeconds(ended - killer.killed)
            << " s after the kill; coordinator's last words:\n"
            << run.coordinator_log.substr(run.coordinator_log.size() > 600
                                              ? run.coordinator_log.size() - 600
                                              : 0)
            << std::endl;
}

// One sparse logistic regression job with one worker, so that the tasks'
// gradients are added in one order and a run repeats bit for bit.
SandblasterJobOptions OneWorkerJob(const std::string& name) {
  SandblasterJobOptions o;
  o.bin_dir = RunfilePath("");
  o.work_dir = TestTmpDir() + "/" + name;
  o.num_servers = 2;
  o.durable = true;
  o.coordinator_flags = {"--problem=sparse_lr",
                         "--data=",
                         "--rows=20000",
                         "--num_features=10000",
                         "--seed=5",
                         "--max_iterations=16",
                         "--tasks=8",
                         "--checkpoint_every_iterations=3",
                         "--table=" + name,
                         "--ftol=0",
                         "--gtol=0"};
  o.workers = {{}};
  return o;
}

// The uninterrupted run the restart tests compare with, run once.
const absl::StatusOr<SandblasterJobResult>& WholeRun() {
  static const auto* whole = new absl::StatusOr<SandblasterJobResult>(
      RunSandblasterJob(OneWorkerJob("whole")));
  return *whole;
}

// `run` resumed from the last checkpoint before its kill (one every 3
// iterations), not from the start, and then did what the uninterrupted run
// did, bit for bit: the state restored is exactly the one saved, and a
// stale task of the killed coordinator's round never counts.
void ExpectResumedAsTheWholeRun(SandblasterJobResult run,
                                SandblasterJobResult whole) {
  EXPECT_EQ(run.resumed_at % 3, 0);
  EXPECT_GT(run.resumed_at, 0);
  EXPECT_LE(run.resumed_at, run.killed_after);
  EXPECT_GE(run.resumed_at, run.killed_after - 3);
  ASSERT_EQ(run.f.size(), whole.f.size()) << "stop: " << run.summary["stop"];
  for (size_t k = 0; k < whole.f.size(); ++k) {
    EXPECT_EQ(run.f[k], whole.f[k]) << "iteration " << k;
  }
  EXPECT_EQ(run.summary["test_accuracy"], whole.summary["test_accuracy"]);
}

TEST(SandblasterFailoverTest, ARestartedCoordinatorResumesFromItsCheckpoint) {
  ASSERT_OK_AND_ASSIGN(SandblasterJobResult whole, WholeRun());
  ASSERT_EQ(whole.f.size(), 17u) << "stop: " << whole.summary["stop"];

  SandblasterJobOptions o = OneWorkerJob("resumed");
  o.kill_coordinator_after = 8;
  ASSERT_OK_AND_ASSIGN(SandblasterJobResult run, RunSandblasterJob(o));
  std::cout << "coordinator killed after iteration " << run.killed_after
            << ", resumed at iteration " << run.resumed_at << std::endl;
  EXPECT_GE(run.killed_after, 8);
  ExpectResumedAsTheWholeRun(run, whole);
  for (int code : run.worker_exit_codes) EXPECT_EQ(code, 0);
}

// The whole job killed -9 mid-run (scheduler, servers, coordinator and
// workers) and started again on the same state and data directories: the
// cluster is restored from the last complete checkpoint, the coordinator
// resumes from the iteration recorded with it, and the job ends as the
// uninterrupted one does, bit for bit.
TEST(SandblasterFailoverTest, AWholeJobRestartResumesFromTheLastCheckpoint) {
  ASSERT_OK_AND_ASSIGN(SandblasterJobResult whole, WholeRun());
  ASSERT_EQ(whole.f.size(), 17u) << "stop: " << whole.summary["stop"];

  SandblasterJobOptions o = OneWorkerJob("restarted");
  o.kill_coordinator_after = 8;
  o.kill_everything = true;
  ASSERT_OK_AND_ASSIGN(SandblasterJobResult run, RunSandblasterJob(o));
  std::cout << "every process killed after iteration " << run.killed_after
            << ", resumed at iteration " << run.resumed_at << std::endl;
  ExpectResumedAsTheWholeRun(run, whole);
  // The first worker was killed; the one started after the restart ends
  // cleanly.
  ASSERT_EQ(run.worker_exit_codes.size(), 2u);
  EXPECT_EQ(run.worker_exit_codes[1], 0);
}

}  // namespace
}  // namespace downpour
