// Sandblaster L-BFGS end to end: the real scheduler, servers, coordinator
// (ps_lbfgs) and workers (ps_worker --job=lbfgs) on 127.0.0.1, against the
// single-process reference run of the same algorithm.
#include <cmath>

#include "common/test_util.h"
#include "lbfgs/coordinator.h"
#include "testing/sandblaster_job.h"

namespace downpour {
namespace {

// Runs a job named `name` on a fresh cluster.
absl::StatusOr<SandblasterJobResult> RunDistributed(
    const std::string& name, std::vector<std::string> coordinator_flags,
    std::vector<std::vector<std::string>> workers) {
  SandblasterJobOptions o;
  o.bin_dir = RunfilePath("");
  o.work_dir = TestTmpDir() + "/" + name;
  o.coordinator_flags = std::move(coordinator_flags);
  o.coordinator_flags.push_back("--table=" + name);
  o.workers = std::move(workers);
  return RunSandblasterJob(o);
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
  auto r = RunLocalLbfgs(
      **problem, o, 32, [&](const IterationRecord& rec) { f.push_back(rec.f); },
      &x);
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
// single-process run to 1e-5 for 10 iterations and 1% at 100.
TEST(SandblasterTest, FollowsSingleProcessRunDespiteAWorkerDying) {
  double ref_accuracy = 0;
  const std::vector<double> ref = Reference(Softmax(), 100, &ref_accuracy);
  ASSERT_EQ(ref.size(), 101u);
  ASSERT_OK_AND_ASSIGN(SandblasterJobResult run,
                       RunDistributed("softmax", {"--max_iterations=100"},
                                      {{}, {}, {"--crash_at_task=5"}}));
  ASSERT_EQ(run.f.size(), 101u) << "stop: " << run.summary.at("stop");
  for (int k = 0; k <= 10; ++k) {
    EXPECT_NEAR(run.f[k], ref[k], 1e-5 * ref[k]) << "iteration " << k;
  }
  // The servers add task gradients in arrival order, so the sums differ
  // from the reference's in the last bits, and 100 L-BFGS iterations
  // (line searches included) amplify that: 0.1-0.6% apart at 100 on this
  // VM, more under load. The tight check is the first 10 iterations; here,
  // the same minimum to 1%, and the absolute bounds below.
  EXPECT_NEAR(run.f[100], ref[100], 0.01 * ref[100]);
  EXPECT_LT(run.f[100], 0.402);
  EXPECT_GE(run.Num("test_accuracy"), 0.84);
  EXPECT_GE(ref_accuracy, 0.84);
  // The crashed worker's task went to someone else.
  EXPECT_EQ(run.worker_exit_codes, (std::vector<int>{0, 0, 3}));
  EXPECT_GE(run.Num("tasks_backup") + run.Num("tasks_reassigned"), 1);
  // Only commands and scalars between coordinator and servers: far below
  // one copy of the 31 KB model per iteration (the final evaluation pulls
  // x once, 31 KB, which is included here).
  EXPECT_LT(run.Num("coordinator_bytes") / 100, 8000);
}

TEST(SandblasterTest, WithoutBackupsAnExpiredLeaseHandsTheTaskOn) {
  const std::vector<double> ref = Reference(Softmax(), 5);
  ASSERT_OK_AND_ASSIGN(
      SandblasterJobResult run,
      RunDistributed("lease",
                     {"--max_iterations=5", "--backup_tasks=false",
                      "--task_lease_ms=1500"},
                     {{}, {"--crash_at_task=3"}}));
  ASSERT_EQ(run.f.size(), 6u);
  for (int k = 0; k <= 5; ++k) {
    EXPECT_NEAR(run.f[k], ref[k], 1e-5 * ref[k]) << "iteration " << k;
  }
  EXPECT_EQ(run.Num("tasks_backup"), 0);
  EXPECT_GE(run.Num("tasks_reassigned"), 1);
  EXPECT_EQ(run.worker_exit_codes, (std::vector<int>{0, 3}));
}

TEST(SandblasterTest, SparseLogisticRegression) {
  proto::SandblasterProblem spec;
  spec.set_kind("sparse_lr");
  spec.set_generate_rows(40000);
  spec.set_num_features(20000);
  spec.set_seed(3);
  const std::vector<double> ref = Reference(spec, 15);
  ASSERT_OK_AND_ASSIGN(SandblasterJobResult run,
                       RunDistributed("sparse",
                                      {"--problem=sparse_lr", "--data=",
                                       "--rows=40000", "--num_features=20000",
                                       "--seed=3", "--max_iterations=15"},
                                      {{}, {}}));
  ASSERT_EQ(run.f.size(), ref.size());
  for (size_t k = 0; k < ref.size(); ++k) {
    EXPECT_NEAR(run.f[k], ref[k], 1e-5 * ref[k]) << "iteration " << k;
  }
  EXPECT_LT(run.f.back(), 0.9 * std::log(2.0));
  EXPECT_GT(run.Num("test_accuracy"), 0.6);
}

}  // namespace
}  // namespace downpour
