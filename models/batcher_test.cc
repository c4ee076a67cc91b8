// Batcher and the BSP learning-rate schedule.
#include "models/batcher.h"

#include <algorithm>
#include <vector>

#include "common/test_util.h"
#include "models/learning_rate.h"

namespace downpour {
namespace {

TEST(BatcherTest, EveryPassVisitsEachExampleOnce) {
  constexpr int kExamples = 10;
  Batcher b(kExamples, 3, 1);
  for (int pass = 0; pass < 3; ++pass) {
    std::vector<int> seen;
    for (int i = 0; i < kExamples / 2; ++i) {
      const std::vector<int> batch = b.Next(2);
      seen.insert(seen.end(), batch.begin(), batch.end());
    }
    std::sort(seen.begin(), seen.end());
    for (int i = 0; i < kExamples; ++i)
      EXPECT_EQ(seen[i], i) << "pass " << pass;
  }
}

TEST(BatcherTest, SameSeedAndStreamSameBatches) {
  Batcher a(1000, 7, 2), b(1000, 7, 2), c(1000, 7, 3), d(1000, 8, 2);
  std::vector<int> first_c, first_d, first_a;
  for (int i = 0; i < 30; ++i) {
    const std::vector<int> x = a.Next(64);
    EXPECT_EQ(x, b.Next(64));
    if (i == 0) {
      first_a = x;
      first_c = c.Next(64);
      first_d = d.Next(64);
    }
  }
  EXPECT_NE(first_a, first_c);  // another stream
  EXPECT_NE(first_a, first_d);  // another seed
}

// The order comes from the portable shuffle (common/random.h), so it is
// the same with every standard library.
TEST(BatcherTest, PinnedOrder) {
  Batcher b(10, 7, 1);
  EXPECT_EQ(b.Next(4), (std::vector<int>{5, 4, 7, 0}));
  EXPECT_EQ(b.Next(6), (std::vector<int>{2, 3, 8, 6, 9, 1}));
}

TEST(BatcherTest, BatchesLargerThanThePassWrapAround) {
  Batcher b(3, 1, 0);
  const std::vector<int> batch = b.Next(7);
  ASSERT_EQ(batch.size(), 7u);
  for (int i : batch) {
    EXPECT_GE(i, 0);
    EXPECT_LT(i, 3);
  }
}

TEST(BspLearningRateTest, LinearWarmupToNTimesTheRate) {
  EXPECT_FLOAT_EQ(BspLearningRate(0.1, 4, 10, 0), 0.1f * (1 + 3 * 0.1f));
  EXPECT_FLOAT_EQ(BspLearningRate(0.1, 4, 10, 4), 0.1f * (1 + 3 * 0.5f));
  EXPECT_FLOAT_EQ(BspLearningRate(0.1, 4, 10, 9), 0.4f);
  EXPECT_FLOAT_EQ(BspLearningRate(0.1, 4, 10, 1000), 0.4f);
  EXPECT_FLOAT_EQ(BspLearningRate(0.1, 1, 10, 0), 0.1f);  // one worker: lr
  EXPECT_FLOAT_EQ(BspLearningRate(0.1, 4, 0, 0), 0.4f);   // no warm-up
}

}  // namespace
}  // namespace downpour
