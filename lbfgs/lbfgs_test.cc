#include "lbfgs/lbfgs.h"

#include <cmath>
#include <fstream>
#include <random>

#include "common/test_util.h"
#include "gtest/gtest.h"
#include "lbfgs/coordinator.h"

namespace downpour {
namespace {

// f(x) = 1/n sum_i 1/2 (a_i . x - b_i)^2, an ill-conditioned least-squares
// problem with a known minimizer x* (b = A x*, so f(x*) = 0).
class LeastSquares final : public TaskProblem {
 public:
  LeastSquares(int n, int dim)
      : n_(n), dim_(dim), a_(n * dim), b_(n), xstar_(dim) {
    std::mt19937 rng(3);
    std::normal_distribution<float> dist;
    for (int j = 0; j < dim; ++j) xstar_[j] = dist(rng);
    for (int i = 0; i < n; ++i) {
      double dot = 0;
      for (int j = 0; j < dim; ++j) {
        // Column scales from 1 to 10.
        a_[i * dim + j] = dist(rng) * (1.0f + 9.0f * j / (dim - 1));
        dot += a_[i * dim + j] * xstar_[j];
      }
      b_[i] = static_cast<float>(dot);
    }
  }
  uint64_t num_examples() const override { return n_; }
  uint64_t num_keys() const override { return dim_; }
  uint32_t width() const override { return 1; }
  uint64_t RegularizedKeys() const override { return 0; }
  std::vector<Key> TaskKeys(uint64_t, uint64_t) const override { return {}; }
  double Compute(uint64_t begin, uint64_t end, absl::Span<const float> x,
                 absl::Span<float> grad) const override {
    std::vector<double> g(dim_, 0.0);
    double loss = 0;
    for (uint64_t i = begin; i < end; ++i) {
      double r = -b_[i];
      for (int j = 0; j < dim_; ++j) r += a_[i * dim_ + j] * x[j];
      loss += 0.5 * r * r;
      for (int j = 0; j < dim_; ++j) g[j] += r * a_[i * dim_ + j];
    }
    for (int j = 0; j < dim_; ++j) grad[j] = static_cast<float>(g[j] / n_);
    return loss / n_;
  }
  absl::StatusOr<std::pair<double, double>> Evaluate(
      absl::Span<const float>) const override {
    return absl::FailedPreconditionError("none");
  }
  const std::vector<float>& xstar() const { return xstar_; }

 private:
  const int n_, dim_;
  std::vector<float> a_, b_, xstar_;
};

TEST(LbfgsTest, ConvergesOnIllConditionedLeastSquares) {
  LeastSquares problem(400, 20);
  LbfgsOptions o;
  o.history = 10;
  o.max_iterations = 200;
  o.lambda = 0;
  o.gtol = 1e-5;
  std::vector<float> x;
  double last_f = INFINITY;
  ASSERT_OK_AND_ASSIGN(LbfgsResult r, RunLocalLbfgs(
                                          problem, o, 7,
                                          [&](const IterationRecord& rec) {
                                            // Wolfe steps never increase the
                                            // objective.
                                            EXPECT_LE(rec.f, last_f)
                                                << "iteration "
                                                << rec.iteration;
                                            last_f = rec.f;
                                          },
                                          &x));
  // Near f = 0 the absolute objective change stops it as often as the
  // gradient norm does; both are convergence.
  EXPECT_THAT(r.stop_reason,
              ::testing::AnyOf("gradient norm", "objective change"));
  // Far fewer iterations than steepest descent would need (hundreds).
  EXPECT_LT(r.iterations.back().iteration, 80);
  EXPECT_LT(r.iterations.back().f, 1e-7);
  for (size_t j = 0; j < x.size(); ++j) {
    EXPECT_NEAR(x[j], problem.xstar()[j], 2e-3) << "coordinate " << j;
  }
}

TEST(LbfgsTest, StopsAtTheIterationLimitAndTheObjectiveChange) {
  LeastSquares problem(100, 10);
  LbfgsOptions o;
  o.lambda = 0;
  o.gtol = 0;
  o.max_iterations = 3;
  ASSERT_OK_AND_ASSIGN(LbfgsResult r, RunLocalLbfgs(problem, o, 4, nullptr));
  EXPECT_EQ(r.stop_reason, "iteration limit");
  EXPECT_EQ(r.iterations.size(), 4u);  // the start and three steps
  o.max_iterations = 1000;
  o.ftol = 1e-3;
  ASSERT_OK_AND_ASSIGN(r, RunLocalLbfgs(problem, o, 4, nullptr));
  EXPECT_EQ(r.stop_reason, "objective change");
  o.history = 0;
  EXPECT_THAT(RunLocalLbfgs(problem, o, 4, nullptr),
              StatusIs(absl::StatusCode::kInvalidArgument));
}

TEST(LbfgsTest, ASavedRunGoesOnExactlyAsTheUninterruptedOne) {
  LeastSquares problem(300, 16);
  LbfgsOptions o;
  o.history = 4;  // the ring of pairs wraps before the save resumed from
  o.max_iterations = 18;
  o.lambda = 0;
  o.gtol = 0;
  o.ftol = 0;
  const size_t nv = LbfgsVectors::Names(o.history).size();
  LocalVectorSpace space(nv, problem.num_keys(), 1);
  LocalObjective objective(&problem, &space, 5);
  std::vector<double> f;
  std::vector<proto::LbfgsState> saved;
  std::vector<std::vector<std::vector<float>>> snapshots;
  LbfgsRunControl control;
  control.on_iteration = [&](const IterationRecord& r) { f.push_back(r.f); };
  control.save_every = 3;
  control.save = [&](const proto::LbfgsState& state) {
    saved.push_back(state);
    std::vector<std::vector<float>> vectors;
    for (size_t v = 0; v < nv; ++v) vectors.push_back(space.vector(v));
    snapshots.push_back(vectors);
    return absl::OkStatus();
  };
  ASSERT_OK_AND_ASSIGN(LbfgsResult full,
                       MinimizeLbfgs(&space, &objective, o, control));
  ASSERT_EQ(full.stop_reason, "iteration limit");
  ASSERT_EQ(saved.size(), 6u);  // after iterations 3, 6, ..., 18
  ASSERT_EQ(saved[2].iteration(), 9);
  EXPECT_EQ(saved[2].pairs_size(), 4);

  // A new process: the vectors of the save after iteration 9, and garbage
  // in the direction, which the resumed run must not read.
  LocalVectorSpace resumed_space(nv, problem.num_keys(), 1);
  for (size_t v = 0; v < nv; ++v) resumed_space.vector(v) = snapshots[2][v];
  for (float& d : resumed_space.vector(LbfgsVectors::kD)) d = 1e30f;
  LocalObjective resumed_objective(&problem, &resumed_space, 5);
  std::vector<IterationRecord> records;
  LbfgsRunControl resume;
  resume.on_iteration = [&](const IterationRecord& r) { records.push_back(r); };
  resume.resume = saved[2];
  ASSERT_OK_AND_ASSIGN(
      LbfgsResult rest,
      MinimizeLbfgs(&resumed_space, &resumed_objective, o, resume));
  EXPECT_EQ(rest.stop_reason, full.stop_reason);
  ASSERT_EQ(records.size(), 10u);  // iteration 9 (where it resumed) to 18
  for (const IterationRecord& r : records) {
    // Bit for bit: the same commands on the same vectors and scalars.
    EXPECT_EQ(r.f, f[r.iteration]) << "iteration " << r.iteration;
    EXPECT_EQ(r.evaluations, full.iterations[r.iteration].evaluations);
  }
  EXPECT_EQ(records.front().iteration, 9);
  EXPECT_EQ(resumed_space.vector(LbfgsVectors::kX),
            space.vector(LbfgsVectors::kX));

  // A state saved with another history does not fit this table.
  o.history = 5;
  LocalVectorSpace other(LbfgsVectors::Names(5).size(), problem.num_keys(), 1);
  LocalObjective other_objective(&problem, &other, 5);
  EXPECT_THAT(MinimizeLbfgs(&other, &other_objective, o, resume),
              StatusIs(absl::StatusCode::kFailedPrecondition));
}

TEST(LbfgsTest, L2TermCoversOnlyTheRegularizedKeys) {
  // With no data term, f = lambda/2 ||x[0:k)||^2; from x = 0 the run stops
  // at once with f = 0, and the gradient of the first evaluation is zero.
  // So start from ones instead, through a space we drive by hand.
  LocalVectorSpace space(LbfgsVectors::Names(3).size(), 6, 2);
  std::fill(space.vector(LbfgsVectors::kX).begin(),
            space.vector(LbfgsVectors::kX).end(), 1.0f);
  class Zero final : public Objective {
   public:
    absl::StatusOr<double> Evaluate(int64_t) override { return 0.0; }
  } zero;
  LbfgsOptions o;
  o.history = 3;
  o.lambda = 0.5;
  o.regularized_keys = 4;  // keys 4 and 5 are free
  o.gtol = 1e-9;
  ASSERT_OK_AND_ASSIGN(LbfgsResult r, MinimizeLbfgs(&space, &zero, o));
  EXPECT_DOUBLE_EQ(r.iterations[0].f, 0.5 * 0.5 * 8);  // 8 regularized floats
  EXPECT_LT(r.iterations.back().f, 1e-12);
  const std::vector<float>& x = space.vector(LbfgsVectors::kX);
  for (int i = 0; i < 8; ++i) EXPECT_NEAR(x[i], 0.0f, 1e-5);
  for (int i = 8; i < 12; ++i) EXPECT_EQ(x[i], 1.0f);  // untouched
}

TEST(LbfgsTest, SplitTasksCoversEveryExampleOnce) {
  auto t = SplitTasks(10, 3);
  ASSERT_EQ(t.size(), 3u);
  EXPECT_EQ(t[0].first, 0u);
  EXPECT_EQ(t[2].second, 10u);
  for (size_t i = 1; i < t.size(); ++i) EXPECT_EQ(t[i].first, t[i - 1].second);
  EXPECT_EQ(SplitTasks(2, 5).size(), 2u);
}

TEST(LbfgsTest, SparseLogisticRegressionLearns) {
  proto::SandblasterProblem spec;
  spec.set_kind("sparse_lr");
  spec.set_generate_rows(20000);
  spec.set_num_features(5000);
  spec.set_seed(4);
  ASSERT_OK_AND_ASSIGN(auto problem, TaskProblem::Load(spec));
  LbfgsOptions o;
  o.max_iterations = 30;
  o.lambda = 1e-4;
  std::vector<float> x;
  ASSERT_OK_AND_ASSIGN(LbfgsResult r,
                       RunLocalLbfgs(*problem, o, 8, nullptr, &x));
  EXPECT_NEAR(r.iterations[0].f, std::log(2.0), 1e-9);  // x = 0: p = 1/2
  EXPECT_LT(r.iterations.back().f, 0.6);
  ASSERT_OK_AND_ASSIGN(auto held_out, problem->Evaluate(x));
  EXPECT_GT(held_out.first, 0.6);             // accuracy
  EXPECT_LT(held_out.second, std::log(2.0));  // better than a coin
}

TEST(LbfgsTest, SparseLogisticRegressionOnALibsvmFile) {
  // Rows of a separable-ish rule: feature 1 means positive, feature 2
  // negative, feature 0 is a constant bias column.
  const std::string path = TestTmpDir() + "/train.libsvm";
  {
    std::ofstream out(path);
    for (int i = 0; i < 200; ++i) {
      out << (i % 2 ? "+1 0:1 1:1" : "-1 0:1 2:1")
          << (i % 7 ? " 3:0.5\n" : "\n");
    }
  }
  proto::SandblasterProblem spec;
  spec.set_kind("sparse_lr");
  spec.set_data_path(path);
  ASSERT_OK_AND_ASSIGN(auto problem, TaskProblem::Load(spec));
  EXPECT_EQ(problem->num_examples(), 200u);
  EXPECT_EQ(problem->num_keys(), 4u);
  LbfgsOptions o;
  o.max_iterations = 20;
  o.lambda = 1e-2;
  std::vector<float> x;
  ASSERT_OK_AND_ASSIGN(LbfgsResult r,
                       RunLocalLbfgs(*problem, o, 8, nullptr, &x));
  EXPECT_LT(r.iterations.back().f, 0.3);
  EXPECT_GT(x[1], 0.5f);   // the positive feature
  EXPECT_LT(x[2], -0.5f);  // the negative one
  spec.set_data_path(TestTmpDir() + "/missing.libsvm");
  EXPECT_THAT(TaskProblem::Load(spec), StatusIs(absl::StatusCode::kNotFound));
}

}  // namespace
}  // namespace downpour
