#include "clicklog/auc.h"

#include <cmath>
#include <vector>

#include "common/random.h"
#include "common/test_util.h"

namespace downpour {
namespace clicklog {
namespace {

TEST(AucTest, KnownValues) {
  EXPECT_DOUBLE_EQ(Auc({0.1f, 0.4f, 0.35f, 0.8f}, {0, 0, 1, 1}), 0.75);
  EXPECT_DOUBLE_EQ(Auc({1, 2, 3, 4}, {0, 0, 1, 1}), 1.0);
  EXPECT_DOUBLE_EQ(Auc({4, 3, 2, 1}, {0, 0, 1, 1}), 0.0);
  // All tied: one half; a tie between one positive and one negative.
  EXPECT_DOUBLE_EQ(Auc({5, 5, 5}, {0, 1, 1}), 0.5);
  EXPECT_DOUBLE_EQ(Auc({1, 2, 2, 3}, {0, 1, 0, 1}), 0.875);
  // One class only.
  EXPECT_DOUBLE_EQ(Auc({1, 2}, {1, 1}), 0.5);
  EXPECT_DOUBLE_EQ(Auc({}, {}), 0.5);
}

TEST(AucTest, LogLoss) {
  EXPECT_NEAR(LogLoss({0.5f, 0.5f}, {0, 1}), std::log(2.0), 1e-7);
  EXPECT_NEAR(LogLoss({0.9f, 0.2f}, {1, 0}),
              -(std::log(0.9) + std::log(0.8)) / 2, 1e-6);
  // Clamped, not infinite.
  EXPECT_LT(LogLoss({0.0f}, {1}), 17.0);
  EXPECT_EQ(LogLoss({}, {}), 0.0);
}

TEST(AucTest, ExpectedAucLimits) {
  EXPECT_DOUBLE_EQ(ExpectedAuc({0.0, 1.0, 0.0, 1.0}), 1.0);
  EXPECT_DOUBLE_EQ(ExpectedAuc({0.3, 0.3, 0.3}), 0.5);
  EXPECT_DOUBLE_EQ(ExpectedAuc({}), 0.5);
  EXPECT_NEAR(ExpectedLogLoss({0.5, 0.5}), std::log(2.0), 1e-12);
  EXPECT_DOUBLE_EQ(ExpectedLogLoss({0.0, 1.0}), 0.0);
}

// The expected AUC is what the empirical AUC of the true probabilities
// averages to over label draws (up to the ratio-of-means difference, small
// for a few hundred rows).
TEST(AucTest, ExpectedAucMatchesDrawnLabels) {
  constexpr int kRows = 400, kDraws = 4000;
  std::vector<double> p(kRows);
  std::vector<float> scores(kRows), labels(kRows);
  for (int i = 0; i < kRows; ++i) {
    // Probabilities with ties (rounded to 1/20).
    p[i] = std::round(20 * Uniform01(SplitMix64(i))) / 20;
    scores[i] = static_cast<float>(p[i]);
  }
  double sum = 0;
  uint64_t word = 12345;
  for (int d = 0; d < kDraws; ++d) {
    for (int i = 0; i < kRows; ++i) {
      labels[i] = Uniform01(SplitMix64(word++)) < p[i] ? 1.0f : 0.0f;
    }
    sum += Auc(scores, labels);
  }
  EXPECT_NEAR(sum / kDraws, ExpectedAuc(p), 0.004);
}

}  // namespace
}  // namespace clicklog
}  // namespace downpour
