// BatchFeatureIds and SparseLogRegLossAndGradient from model.h.
#include <cmath>
#include <cstdio>
#include <random>
#include <sstream>

#include "common/test_util.h"
#include "models/dataset.h"
#include "models/model.h"

namespace downpour {
namespace {

SparseDataset Small() {
  std::istringstream in(
      "1 5:1 2:0.5\n"
      "0 2:-1 9:2\n"
      "1 9:1 5:0.25 100:3\n"
      "0 7:1\n");
  auto d = ParseLibsvm(in);
  EXPECT_OK(d);
  return *d;
}

TEST(BatchFeatureIds, SortedDistinctIdsOfTheRange) {
  const SparseDataset d = Small();
  EXPECT_EQ(BatchFeatureIds(d, 0, 4), (std::vector<uint64_t>{2, 5, 7, 9, 100}));
  EXPECT_EQ(BatchFeatureIds(d, 1, 3), (std::vector<uint64_t>{2, 5, 9, 100}));
  EXPECT_EQ(BatchFeatureIds(d, 3, 4), (std::vector<uint64_t>{7}));
  EXPECT_TRUE(BatchFeatureIds(d, 2, 2).empty());
}

TEST(SparseLogReg, KnownValues) {
  // One row, label 1, features 5:1 2:0.5, weights w2 = 2, w5 = -1: z = 0.
  const SparseDataset d = Small();
  const std::vector<uint64_t> ids = {2, 5};
  const std::vector<float> w = {2, -1};
  std::vector<float> g(2);
  const double loss =
      SparseLogRegLossAndGradient(d, 0, 1, ids, w, absl::MakeSpan(g));
  EXPECT_NEAR(loss, std::log(2.0), 1e-12);
  // dz = sigmoid(0) - 1 = -0.5, times the feature values.
  EXPECT_FLOAT_EQ(g[0], -0.25f);
  EXPECT_FLOAT_EQ(g[1], -0.5f);
  // With L2 0.1: + 0.05 * (4 + 1) in the loss, + 0.1 * w in the gradient.
  const double loss_l2 =
      SparseLogRegLossAndGradient(d, 0, 1, ids, w, absl::MakeSpan(g), 0.1f);
  EXPECT_NEAR(loss_l2, std::log(2.0) + 0.25, 1e-6);
  EXPECT_FLOAT_EQ(g[0], -0.25f + 0.2f);
  EXPECT_FLOAT_EQ(g[1], -0.5f - 0.1f);
}

TEST(SparseLogReg, ExtremeLogitsStayFinite) {
  const SparseDataset d = Small();
  const std::vector<uint64_t> ids = {7};
  std::vector<float> g(1);
  // Row 3 has label 0; z = 1e4 is confidently wrong: loss 1e4, not inf.
  const std::vector<float> w = {1e4f};
  EXPECT_NEAR(SparseLogRegLossAndGradient(d, 3, 4, ids, w, absl::MakeSpan(g)),
              1e4, 1e-6);
  EXPECT_FLOAT_EQ(g[0], 1.0f);
  const std::vector<float> w_neg = {-1e4f};
  EXPECT_NEAR(
      SparseLogRegLossAndGradient(d, 3, 4, ids, w_neg, absl::MakeSpan(g)), 0.0,
      1e-12);
}

// Central differences over the weights of a random batch of generated
// rows; the loss is computed in double, so float weights suffice.
TEST(SparseLogReg, GradientMatchesFiniteDifferences) {
  const SparseDataset d = GenerateClickData(64, 8, 200, 1.0, 5);
  const std::vector<uint64_t> ids = BatchFeatureIds(d, 10, 50);
  ASSERT_GT(ids.size(), 20u);
  std::mt19937_64 rng(1);
  std::normal_distribution<float> normal(0, 0.5f);
  std::vector<float> w(ids.size());
  for (float& v : w) v = normal(rng);
  // Values other than 1 too, so the value factor is exercised.
  SparseDataset scaled = d;
  for (size_t i = 0; i < scaled.feature_values.size(); ++i) {
    scaled.feature_values[i] = 0.5f + (i % 5) * 0.25f;
  }
  std::vector<float> g(ids.size()), scratch(ids.size());
  SparseLogRegLossAndGradient(scaled, 10, 50, ids, w, absl::MakeSpan(g), 0.01f);
  double worst = 0;
  for (size_t i = 0; i < ids.size(); ++i) {
    const float orig = w[i];
    w[i] = orig + 1e-2f;
    const float up_w = w[i];
    const double up = SparseLogRegLossAndGradient(
        scaled, 10, 50, ids, w, absl::MakeSpan(scratch), 0.01f);
    w[i] = orig - 1e-2f;
    const float down_w = w[i];
    const double down = SparseLogRegLossAndGradient(
        scaled, 10, 50, ids, w, absl::MakeSpan(scratch), 0.01f);
    w[i] = orig;
    const double numeric = (up - down) / (double{up_w} - down_w);
    worst = std::max(
        worst, std::abs(numeric - g[i]) /
                   std::max({std::abs(numeric), std::abs(double{g[i]}), 1e-3}));
  }
  EXPECT_LT(worst, 1e-3);
}

TEST(SparseLogReg, IdsNotInTheBatchGetOnlyTheL2Part) {
  const SparseDataset d = Small();
  const std::vector<uint64_t> ids = {2, 3, 5};  // 3 is in no row
  const std::vector<float> w = {0.5f, 2.0f, -0.5f};
  std::vector<float> g(3);
  SparseLogRegLossAndGradient(d, 0, 1, ids, w, absl::MakeSpan(g), 0.1f);
  EXPECT_FLOAT_EQ(g[1], 0.2f);
  SparseLogRegLossAndGradient(d, 0, 1, ids, w, absl::MakeSpan(g), 0.0f);
  EXPECT_EQ(g[1], 0.0f);
}

// Mean log-loss of a constant prediction at the base rate of rows
// [begin, end): the bar a model must beat to have learned anything.
double BaseRateLoss(const SparseDataset& d, size_t begin, size_t end) {
  double pos = 0;
  for (size_t r = begin; r < end; ++r) pos += d.labels[r];
  const double p = pos / (end - begin);
  return -(p * std::log(p) + (1 - p) * std::log(1 - p));
}

// The worker's loop in miniature: for each batch, pull the weights of its
// ids from a dense table, compute, push the gradient for those ids. The
// generated labels come from hidden weights, so held-out loss must drop
// well below the base rate's.
TEST(SparseLogReg, LearnsGeneratedClickData) {
  constexpr uint64_t kFeatures = 10000;
  const SparseDataset d = GenerateClickData(60000, 20, kFeatures, 1.1, 9);
  const size_t train_end = 50000, rows = d.NumRows();
  std::vector<float> table(kFeatures, 0.0f);
  constexpr size_t kBatch = 100;
  constexpr float kLr = 0.5f;
  for (int epoch = 0; epoch < 3; ++epoch) {
    for (size_t b = 0; b < train_end; b += kBatch) {
      const std::vector<uint64_t> ids = BatchFeatureIds(d, b, b + kBatch);
      std::vector<float> w(ids.size()), g(ids.size());
      for (size_t i = 0; i < ids.size(); ++i) w[i] = table[ids[i]];
      SparseLogRegLossAndGradient(d, b, b + kBatch, ids, w, absl::MakeSpan(g),
                                  1e-4f);
      for (size_t i = 0; i < ids.size(); ++i) table[ids[i]] -= kLr * g[i];
    }
  }
  const std::vector<uint64_t> ids = BatchFeatureIds(d, train_end, rows);
  std::vector<float> w(ids.size()), g(ids.size());
  for (size_t i = 0; i < ids.size(); ++i) w[i] = table[ids[i]];
  const double held_out = SparseLogRegLossAndGradient(d, train_end, rows, ids,
                                                      w, absl::MakeSpan(g));
  const double base = BaseRateLoss(d, train_end, rows);
  int correct = 0;
  for (size_t r = train_end; r < rows; ++r) {
    double z = 0;
    for (size_t f = d.row_offsets[r]; f < d.row_offsets[r + 1]; ++f) {
      z += table[d.feature_ids[f]] * d.feature_values[f];
    }
    correct += (z > 0) == (d.labels[r] == 1.0f);
  }
  const double accuracy = static_cast<double>(correct) / (rows - train_end);
  std::printf("held-out log-loss %.4f (base rate %.4f), accuracy %.4f\n",
              held_out, base, accuracy);
  EXPECT_LT(held_out, base - 0.1);
  EXPECT_GT(accuracy, 0.7);
}

TEST(SparseLogRegDeathTest, MissingIdIsAProgrammerError) {
  const SparseDataset d = Small();
  const std::vector<uint64_t> ids = {2};  // row 0 also has 5
  const std::vector<float> w = {1};
  std::vector<float> g(1);
  EXPECT_DEATH(SparseLogRegLossAndGradient(d, 0, 1, ids, w, absl::MakeSpan(g)),
               "feature id 5 of row 0");
  const std::vector<uint64_t> unsorted = {5, 2};
  const std::vector<float> w2 = {1, 1};
  std::vector<float> g2(2);
  EXPECT_DEATH(
      SparseLogRegLossAndGradient(d, 0, 1, unsorted, w2, absl::MakeSpan(g2)),
      "not sorted");
}

}  // namespace
}  // namespace downpour
