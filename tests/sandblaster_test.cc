// Sandblaster L-BFGS end to end: the real scheduler, servers, coordinator
// (ps_lbfgs) and workers (ps_worker --job=lbfgs) on 127.0.0.1, against the
// single-process reference run of the same algorithm.
#include <sys/wait.h>

#include <cmath>
#include <fstream>
#include <filesystem>
#include <map>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "common/status_macros.h"
#include "common/test_util.h"
#include "lbfgs/coordinator.h"
#include "tools/local_cluster.h"

namespace downpour {
namespace {

struct JobRun {
  std::vector<double> f;  // by iteration
  std::map<std::string, std::string> summary;
  double Num(const std::string& key) const {
    double v = NAN;
    auto it = summary.find(key);
    if (it != summary.end()) (void)absl::SimpleAtod(it->second, &v);
    return v;
  }
};

// Starts a cluster, the coordinator with `coordinator_flags` and one worker
// per entry of `worker_flags`; waits for the coordinator to finish.
absl::StatusOr<JobRun> RunDistributed(const std::string& name,
                                   std::vector<std::string> coordinator_flags,
                                   std::vector<std::vector<std::string>> worker_flags,
                                   std::vector<int>* worker_exits) {
  const std::string dir = TestTmpDir() + "/" + name;
  std::filesystem::create_directories(dir);
  LocalClusterOptions o;
  o.bin_dir = RunfilePath("");
  o.work_dir = dir;
  o.num_servers = 2;
  DP_ASSIGN_OR_RETURN(auto cluster, LocalCluster::Start(o));
  std::vector<std::string> argv = {
      RunfilePath("lbfgs/ps_lbfgs"), "--scheduler=" + cluster->scheduler_address(),
      "--address_file=" + dir + "/coordinator", "--trace_csv=" + dir + "/trace.csv",
      "--summary_file=" + dir + "/summary", "--table=" + name};
  argv.insert(argv.end(), coordinator_flags.begin(), coordinator_flags.end());
  Subprocess coordinator(argv, dir + "/coordinator.log");
  DP_RETURN_IF_ERROR(coordinator.Start());
  DP_ASSIGN_OR_RETURN(std::string address,
                      WaitForFile(dir + "/coordinator", absl::Seconds(60)));
  std::vector<std::unique_ptr<Subprocess>> workers;
  for (size_t i = 0; i < worker_flags.size(); ++i) {
    std::vector<std::string> w = {
        RunfilePath("worker/ps_worker"), "--job=lbfgs",
        "--scheduler=" + cluster->scheduler_address(),
        "--coordinator=" + address, "--name=w" + std::to_string(i)};
    w.insert(w.end(), worker_flags[i].begin(), worker_flags[i].end());
    workers.push_back(std::make_unique<Subprocess>(
        w, dir + "/worker" + std::to_string(i) + ".log"));
    DP_RETURN_IF_ERROR(workers.back()->Start());
  }
  DP_ASSIGN_OR_RETURN(int status, coordinator.Wait(absl::Minutes(5)));
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    return absl::InternalError("coordinator failed: " + coordinator.LogTail());
  }
  for (auto& w : workers) {
    DP_ASSIGN_OR_RETURN(int ws, w->Wait(absl::Seconds(30)));
    worker_exits->push_back(WIFEXITED(ws) ? WEXITSTATUS(ws) : -1);
  }
  DP_RETURN_IF_ERROR(cluster->Stop());
  JobRun run;
  std::ifstream trace(dir + "/trace.csv");
  std::string line;
  std::getline(trace, line);  // header
  while (std::getline(trace, line)) {
    std::vector<std::string> cols = absl::StrSplit(line, ',');
    double f;
    if (cols.size() < 2 || !absl::SimpleAtod(cols[1], &f)) {
      return absl::DataLossError("bad trace line: " + line);
    }
    run.f.push_back(f);
  }
  std::ifstream summary(dir + "/summary");
  while (std::getline(summary, line)) {
    std::pair<std::string, std::string> kv = absl::StrSplit(line, '=');
    run.summary[kv.first] = kv.second;
  }
  return run;
}

std::vector<double> Reference(const proto::SandblasterProblem& spec,
                              int iterations, double* accuracy = nullptr) {
  auto problem = TaskProblem::Load(spec);
  EXPECT_OK(problem);
  if (!problem.ok()) return {};
  LbfgsOptions o;
  o.max_iterations = iterations;
  std::vector<double> f;
  std::vector<float> x;
  auto r = RunLocalLbfgs(**problem, o, 32,
                         [&](const IterationRecord& rec) { f.push_back(rec.f); }, &x);
  EXPECT_OK(r);
  if (accuracy != nullptr) *accuracy = (*problem)->Evaluate(x)->first;
  return f;
}

proto::SandblasterProblem Softmax() {
  proto::SandblasterProblem spec;
  spec.set_kind("softmax");
  spec.set_data_path("/usr/share/datasets/fashion-mnist");
  return spec;
}

// The acceptance run: 100 iterations on Fashion-MNIST with three
// workers, one of which dies inside a task; the objective follows the
// single-process run to 1e-5 for 10 iterations and 0.5% at 100.
TEST(SandblasterTest, FollowsSingleProcessRunDespiteAWorkerDying) {
  double ref_accuracy = 0;
  const std::vector<double> ref = Reference(Softmax(), 100, &ref_accuracy);
  ASSERT_EQ(ref.size(), 101u);
  std::vector<int> exits;
  ASSERT_OK_AND_ASSIGN(
      JobRun run, RunDistributed("softmax", {"--max_iterations=100"},
                              {{}, {}, {"--crash_at_task=5"}}, &exits));
  ASSERT_EQ(run.f.size(), 101u) << "stop: " << run.summary["stop"];
  for (int k = 0; k <= 10; ++k) {
    EXPECT_NEAR(run.f[k], ref[k], 1e-5 * ref[k]) << "iteration " << k;
  }
  EXPECT_NEAR(run.f[100], ref[100], 0.005 * ref[100]);
  EXPECT_LT(run.f[100], 0.402);
  EXPECT_GE(run.Num("test_accuracy"), 0.84);
  EXPECT_GE(ref_accuracy, 0.84);
  // The crashed worker's task went to someone else.
  EXPECT_EQ(exits, (std::vector<int>{0, 0, 3}));
  EXPECT_GE(run.Num("tasks_backup") + run.Num("tasks_reassigned"), 1);
  // Only commands and scalars between coordinator and servers: far below
  // one copy of the 31 KB model per iteration (the final evaluation pulls
  // x once, 31 KB, which is included here).
  EXPECT_LT(run.Num("coordinator_bytes") / 100, 8000);
}

TEST(SandblasterTest, WithoutBackupsAnExpiredLeaseHandsTheTaskOn) {
  const std::vector<double> ref = Reference(Softmax(), 5);
  std::vector<int> exits;
  ASSERT_OK_AND_ASSIGN(
      JobRun run, RunDistributed("lease",
                              {"--max_iterations=5", "--backup_tasks=false",
                               "--task_lease_ms=1500"},
                              {{}, {"--crash_at_task=3"}}, &exits));
  ASSERT_EQ(run.f.size(), 6u);
  for (int k = 0; k <= 5; ++k) {
    EXPECT_NEAR(run.f[k], ref[k], 1e-5 * ref[k]) << "iteration " << k;
  }
  EXPECT_EQ(run.Num("tasks_backup"), 0);
  EXPECT_GE(run.Num("tasks_reassigned"), 1);
  EXPECT_EQ(exits, (std::vector<int>{0, 3}));
}

TEST(SandblasterTest, SparseLogisticRegression) {
  proto::SandblasterProblem spec;
  spec.set_kind("sparse_lr");
  spec.set_generate_rows(40000);
  spec.set_num_features(20000);
  spec.set_seed(3);
  const std::vector<double> ref = Reference(spec, 15);
  std::vector<int> exits;
  ASSERT_OK_AND_ASSIGN(
      JobRun run,
      RunDistributed("sparse", {"--problem=sparse_lr", "--data=", "--rows=40000",
                                "--num_features=20000", "--seed=3",
                                "--max_iterations=15"},
                     {{}, {}}, &exits));
  ASSERT_EQ(run.f.size(), ref.size());
  for (size_t k = 0; k < ref.size(); ++k) {
    EXPECT_NEAR(run.f[k], ref[k], 1e-5 * ref[k]) << "iteration " << k;
  }
  EXPECT_LT(run.f.back(), 0.9 * std::log(2.0));
  EXPECT_GT(run.Num("test_accuracy"), 0.6);
}

}  // namespace
}  // namespace downpour
