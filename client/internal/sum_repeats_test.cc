#include "client/internal/sum_repeats.h"

#include <map>
#include <random>
#include <vector>

#include "client/internal/first_seen.h"
#include "common/test_util.h"
#include "gtest/gtest.h"

namespace downpour {
namespace {

// The obvious way: a map from key to its place among the distinct keys,
// rows summed in batch order.
void Reference(const std::vector<Key>& keys, const std::vector<float>& values,
               size_t width, std::vector<Key>* out_keys,
               std::vector<float>* out) {
  std::map<Key, size_t> place;
  for (size_t i = 0; i < keys.size(); ++i) {
    auto [it, fresh] = place.emplace(keys[i], out_keys->size());
    if (fresh) {
      out_keys->push_back(keys[i]);
      out->insert(out->end(), values.begin() + i * width,
                  values.begin() + (i + 1) * width);
    } else {
      for (size_t c = 0; c < width; ++c) {
        (*out)[it->second * width + c] += values[i * width + c];
      }
    }
  }
}

void ExpectMatchesReference(const std::vector<Key>& keys, size_t width,
                            std::mt19937_64& rng) {
  std::vector<float> values(keys.size() * width);
  // Values whose sums round differently in another order.
  std::uniform_real_distribution<float> u(-1, 1);
  for (float& v : values) v = u(rng) * 1e3f + u(rng) * 1e-3f;
  std::vector<Key> want_keys;
  std::vector<float> want;
  Reference(keys, values, width, &want_keys, &want);
  BufferPool pool;
  Buffer got_keys, got;
  absl::StatusOr<size_t> d =
      SumRepeats(keys, values.data(), width, pool, &got_keys, &got);
  ASSERT_TRUE(d.ok()) << d.status();
  ASSERT_EQ(*d, want_keys.size());
  if (*d == keys.size()) {
    EXPECT_EQ(got_keys.size(), 0u) << "nothing written without repeats";
    return;
  }
  const Key* k = reinterpret_cast<const Key*>(got_keys.data());
  const float* v = reinterpret_cast<const float*>(got.data());
  for (size_t i = 0; i < *d; ++i) {
    ASSERT_EQ(k[i], want_keys[i]) << "distinct key " << i;
    for (size_t c = 0; c < width; ++c) {
      // Bit for bit: the same additions in the same order.
      ASSERT_EQ(v[i * width + c], want[i * width + c])
          << "key " << k[i] << " column " << c;
    }
  }
}

TEST(SumRepeatsTest, SumsEachKeysRowsInBatchOrder) {
  const uint32_t seed = TestSeed(5);
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937_64 rng(seed);
  // Each width that has a pass of its own (WithFixedWidth), and others.
  for (size_t width : {1, 2, 3, 4, 8, 16, 32, 64, 65}) {
    for (size_t n : {2, 17, 1000, 100000}) {
      std::vector<Key> keys(n);
      for (Key& k : keys) k = (rng() % (n / 4 + 2)) * 0x9E3779B97F4A7C15ull;
      ExpectMatchesReference(keys, width, rng);
    }
  }
}

TEST(SumRepeatsTest, ABatchWithoutRepeatsIsLeftAsItIs) {
  std::mt19937_64 rng(1);
  std::vector<Key> keys(5000);
  for (size_t i = 0; i < keys.size(); ++i) keys[i] = keys.size() - i;
  ExpectMatchesReference(keys, 4, rng);
}

TEST(SumRepeatsTest, ABatchLargerThanTheFirstSeenTableFindsEveryRepeat) {
  // More distinct keys than FirstSeen records, repeats at both ends.
  std::mt19937_64 rng(TestSeed(9));
  const size_t n = FirstSeen::kMaxEntries / 2 + 100000;
  std::vector<Key> keys(n);
  for (size_t i = 0; i < n; ++i) keys[i] = i * 7919;
  for (size_t i = 0; i < 1000; ++i) {
    keys[n - 1 - i] = keys[rng() % n];  // late repeats of any key
    keys[i] = keys[n - 1 - rng() % 1000];
  }
  ExpectMatchesReference(keys, 1, rng);
}

}  // namespace
}  // namespace downpour
