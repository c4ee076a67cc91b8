#include "clicklog/feature_key.h"

#include <unordered_set>

#include "common/random.h"
#include "common/test_util.h"

namespace downpour {
namespace clicklog {
namespace {

TEST(FeatureKeyTest, FeatureZeroIsSplitMix) {
  for (uint64_t id : {0ull, 1ull, 12345ull, 0xffffffffull}) {
    EXPECT_EQ(FeatureKey(0, id), SplitMix64(id));
  }
  // Known values, shared with python/tests/embedding_test.py.
  EXPECT_EQ(FeatureKey(0, 0), 0xe220a8397b1dcdafull);
  EXPECT_EQ(FeatureKey(3, 7), SplitMix64(7 ^ (3 * 0xd1b54a32d192ed03ull)));
}

TEST(FeatureKeyTest, DistinctIdsOfAFeatureGetDistinctKeys) {
  std::unordered_set<uint64_t> keys;
  for (uint64_t f = 0; f < 4; ++f) {
    for (uint64_t id = 0; id < 100000; ++id) {
      const uint64_t k = FeatureKey(f, id);
      EXPECT_NE(k, ~uint64_t{0});
      keys.insert(k);
    }
  }
  EXPECT_EQ(keys.size(), 400000u);
}

// Features f != f' collide only where id ^ id' equals their salts' xor; for
// features below 1024 that xor has a bit at or above 40, so ids below 2^40
// never collide across features.
TEST(FeatureKeyTest, SaltsDifferAboveBit40) {
  for (uint64_t f = 0; f < 1024; ++f) {
    for (uint64_t g = f + 1; g < 1024; ++g) {
      ASSERT_NE((FeatureSalt(f) ^ FeatureSalt(g)) >> 40, 0u)
          << "features " << f << " and " << g;
    }
  }
}

}  // namespace
}  // namespace clicklog
}  // namespace downpour
