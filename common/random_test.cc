// The reproducible randomness of common/random.h: its outputs are pinned,
// since runs are meant to repeat on every compiler and standard library.
#include "common/random.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "common/test_util.h"

namespace downpour {
namespace {

TEST(SplitMix64Test, KnownOutputs) {
  // The reference generator (Vigna's splitmix64.c) seeded with 0 returns
  // SplitMix64(0), SplitMix64(0x9e3779b97f4a7c15), ...
  EXPECT_EQ(SplitMix64(0), 0xe220a8397b1dcdafull);
  EXPECT_EQ(SplitMix64(0x9e3779b97f4a7c15ull), 0x6e789e6aa1b965f4ull);
  EXPECT_EQ(SplitMix64(1234567), 0x599ed017fb08fc85ull);
}

TEST(Uniform01Test, Range) {
  EXPECT_EQ(Uniform01(0), 0.0);
  EXPECT_LT(Uniform01(~uint64_t{0}), 1.0);
  EXPECT_EQ(Uniform01(uint64_t{1} << 63), 0.5);
}

TEST(ShuffleTest, IsAPermutationAndPinned) {
  std::vector<int> v(10);
  std::iota(v.begin(), v.end(), 0);
  std::mt19937_64 rng(StreamSeed(7, 1));
  Shuffle(absl::MakeSpan(v), rng);
  std::vector<int> sorted = v;
  std::sort(sorted.begin(), sorted.end());
  for (int i = 0; i < 10; ++i) EXPECT_EQ(sorted[i], i);
  // mt19937_64's output is fixed by the C++ standard and the swaps by
  // Shuffle: this order must not change with the library.
  EXPECT_EQ(v, (std::vector<int>{5, 4, 7, 0, 2, 3, 8, 6, 9, 1}));
  std::vector<int> empty;
  Shuffle(absl::MakeSpan(empty), rng);
  std::vector<int> one = {4};
  Shuffle(absl::MakeSpan(one), rng);
  EXPECT_EQ(one, std::vector<int>{4});
}

TEST(StreamSeedTest, DistinctStreams) {
  EXPECT_EQ(StreamSeed(7, 1), 7u * 1000003 + 1);
  EXPECT_NE(StreamSeed(7, 1), StreamSeed(7, 2));
  EXPECT_NE(StreamSeed(7, 1), StreamSeed(8, 1));
}

TEST(StandardNormalTest, MomentsAndRepeatability) {
  std::mt19937_64 a(3), b(3);
  double sum = 0, sum_sq = 0;
  constexpr int kDraws = 200000;
  for (int i = 0; i < kDraws; ++i) {
    const double z = StandardNormal(a);
    EXPECT_EQ(z, StandardNormal(b));
    ASSERT_TRUE(std::isfinite(z));
    sum += z;
    sum_sq += z * z;
  }
  EXPECT_NEAR(sum / kDraws, 0.0, 0.01);
  EXPECT_NEAR(sum_sq / kDraws, 1.0, 0.01);
}

}  // namespace
}  // namespace downpour
