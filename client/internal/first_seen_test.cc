#include "client/internal/first_seen.h"

#include <map>
#include <numeric>
#include <random>
#include <utility>
#include <vector>

#include "gtest/gtest.h"

namespace downpour {
namespace {

TEST(FirstSeenTest, RepeatsPointAtTheFirstPosition) {
  for (int batch = 0; batch < 3; ++batch) {
    FirstSeen& seen = FirstSeen::ForThisThread(8);
    // A new batch forgets the last one's keys.
    EXPECT_EQ(seen.Insert(7, 0), 0u);
    EXPECT_EQ(seen.Insert(9, 1), 1u);
    EXPECT_EQ(seen.Insert(7, 2), 0u);
    EXPECT_EQ(seen.Insert(9, 3), 1u);
    EXPECT_EQ(seen.Insert(10, 4), 4u);
  }
}

TEST(FirstSeenTest, AgreesWithAMapOnManyKeys) {
  std::mt19937_64 rng(3);
  for (size_t n : {100, 5000, 70000}) {
    FirstSeen& seen = FirstSeen::ForThisThread(n);
    std::vector<Key> keys(n);
    for (Key& k : keys) k = rng() % (n / 3 + 1);
    std::vector<size_t> want(n);
    for (size_t i = 0; i < n; ++i) {
      want[i] = i;
      for (size_t j = 0; j < i; ++j) {
        if (keys[j] == keys[i]) {
          want[i] = j;
          break;
        }
      }
      if (n > 5000 && i > 2000) break;  // the quadratic reference is slow
    }
    for (size_t i = 0; i < n; ++i) {
      const size_t got = seen.Insert(keys[i], i);
      if (n <= 5000 || i <= 2000) {
        ASSERT_EQ(got, want[i]) << n << " " << i;
      }
      ASSERT_LE(got, i);
      ASSERT_EQ(keys[got], keys[i]);
    }
  }
}

TEST(FirstSeenTest, InsertBatchIsInsertKeyByKey) {
  std::mt19937_64 rng(5);
  std::vector<Key> keys(30000);
  for (Key& k : keys) k = rng() % 4000;
  std::vector<size_t> positions;
  for (size_t i = 0; i < keys.size(); i += 3) positions.push_back(i);
  for (const Selection& s :
       {Selection::Slice(100, 20000), Selection::List(positions)}) {
    std::vector<uint32_t> want(s.size()), got(s.size());
    FirstSeen& one = FirstSeen::ForThisThread(s.size());
    for (size_t i = 0; i < s.size(); ++i) {
      want[i] = one.Insert(keys[s.at(i)], s.at(i));
    }
    FirstSeen::ForThisThread(s.size()).InsertBatch(keys, s, got.data());
    EXPECT_EQ(got, want);
  }
}

TEST(FirstSeenTest, NumberBatchNumbersKeysInTheOrderTheyFirstCome) {
  std::mt19937_64 rng(7);
  for (size_t n : {0, 1, 15, 16, 17, 30000}) {
    std::vector<Key> keys(n);
    for (Key& k : keys) k = rng() % (n / 3 + 2);
    // Reference: a key's number is how many distinct keys came before its
    // first occurrence.
    std::map<Key, size_t> number;
    std::vector<std::pair<size_t, bool>> want;  // (number, first)
    for (Key k : keys) {
      const bool first = number.emplace(k, number.size()).second;
      want.emplace_back(number[k], first);
    }
    std::vector<std::pair<size_t, bool>> got;
    std::vector<size_t> order;  // positions in the order of the calls
    const size_t distinct = FirstSeen::ForThisThread(n).NumberBatch(
        keys,
        [&](size_t i, size_t d) {
          got.emplace_back(d, true);
          order.push_back(i);
        },
        [&](size_t i, size_t d) {
          got.emplace_back(d, false);
          order.push_back(i);
        });
    EXPECT_EQ(distinct, number.size()) << n;
    EXPECT_EQ(got, want) << n;
    std::vector<size_t> in_order(n);
    std::iota(in_order.begin(), in_order.end(), 0);
    EXPECT_EQ(order, in_order) << n;
  }
}

TEST(FirstSeenTest, AFullTableStopsRecordingButStaysRight) {
  // More distinct keys than the table takes: the first ones fold, the
  // rest come back as their own first occurrence.
  const size_t n = FirstSeen::kMaxEntries;
  FirstSeen& seen = FirstSeen::ForThisThread(n);
  for (size_t i = 0; i < n; ++i) ASSERT_EQ(seen.Insert(1000 + i, i), i);
  EXPECT_EQ(seen.Insert(1000, n), 0u);                 // recorded: folds
  EXPECT_EQ(seen.Insert(1000 + n - 1, n + 1), n + 1);  // not recorded
}

TEST(FirstSeenTest, OnlyBatchesThatRepeatAreWorthFolding) {
  std::vector<Key> distinct(10000), repeating(10000);
  for (size_t i = 0; i < distinct.size(); ++i) {
    distinct[i] = i * 0x9E3779B97F4A7C15ull;
    repeating[i] = (i % 1000) * 0x9E3779B97F4A7C15ull;
  }
  const Selection all = Selection::Slice(0, 10000);
  EXPECT_FALSE(RepeatsWorthFolding(distinct, all));
  // The sample is the batch's first 2048 keys: 1048 repeats of 1000 ids.
  EXPECT_TRUE(RepeatsWorthFolding(repeating, all));
  // One repeat in 16: not enough.
  std::vector<Key> few = distinct;
  for (size_t i = 0; i < 2048; i += 16) few[i + 1] = few[i];
  EXPECT_FALSE(RepeatsWorthFolding(few, all));
  // One in four: enough.
  for (size_t i = 0; i < 2048; i += 4) few[i + 1] = few[i];
  EXPECT_TRUE(RepeatsWorthFolding(few, all));
  // Too few keys to judge.
  EXPECT_FALSE(RepeatsWorthFolding(repeating, Selection::Slice(0, 8)));
  // A list selection reads through its positions.
  const std::vector<size_t> positions = {0,    1000, 2000, 3000, 4000, 5000,
                                         6000, 7000, 8000, 9000, 0,    1000,
                                         2000, 3000, 4000, 5000};
  EXPECT_TRUE(RepeatsWorthFolding(repeating, Selection::List(positions)));
}

}  // namespace
}  // namespace downpour
