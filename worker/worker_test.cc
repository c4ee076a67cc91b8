// Pure pieces of the worker daemon: the sparse_lr data sharding and the
// feature-id to key mapping. The daemon itself is tested through real
// processes (tests/training_test.cc, tests/sparse_training_test.cc).
#include "worker/worker.h"

#include <algorithm>
#include <vector>

#include "common/test_util.h"
#include "common/types.h"

namespace downpour {
namespace {

TEST(SparseTrainRowsTest, ShardsAreDisjointCoverTheTrainingRowsAndRepeat) {
  for (size_t rows : {0, 1, 7, 1000, 1001}) {
    for (int workers : {1, 2, 3, 5}) {
      std::vector<int> owner(rows, -1);
      for (int rank = 0; rank < workers; ++rank) {
        const std::vector<size_t> mine = SparseTrainRows(rows, rank, workers, 42);
        EXPECT_EQ(mine, SparseTrainRows(rows, rank, workers, 42));
        // Sizes differ by at most one.
        EXPECT_LE(mine.size(), rows / workers + 1);
        EXPECT_GE(mine.size(), rows / workers);
        for (size_t r : mine) {
          ASSERT_LT(r, rows);
          EXPECT_EQ(owner[r], -1) << "row " << r << " in two shards";
          owner[r] = rank;
          EXPECT_EQ(static_cast<int>(r % workers), rank);
        }
      }
      EXPECT_EQ(std::count(owner.begin(), owner.end(), -1), 0)
          << rows << " rows, " << workers << " workers";
    }
  }
}

TEST(SparseTrainRowsTest, ShuffleDependsOnSeedAndRankOnly) {
  const std::vector<size_t> a = SparseTrainRows(10000, 1, 2, 7);
  std::vector<size_t> sorted = a;
  std::sort(sorted.begin(), sorted.end());
  EXPECT_NE(a, sorted);  // shuffled
  EXPECT_NE(a, SparseTrainRows(10000, 1, 2, 8));
  // Pinned: the order must not change with the standard library
  // (mt19937_64's output is fixed by the C++ standard).
  EXPECT_EQ(std::vector<size_t>(a.begin(), a.begin() + 5),
            (std::vector<size_t>{3855, 1743, 3083, 8515, 5397}));
}

TEST(SparseFeatureKeyTest, SpreadsSmallIdsOverTheKeySpace) {
  // Small ids must not all fall in the first server's range.
  int high = 0;
  for (uint64_t id = 0; id < 1000; ++id) {
    const uint64_t k = SparseFeatureKey(id);
    EXPECT_LT(k, kKeySpaceEnd);
    high += k >= kKeySpaceEnd / 2;
  }
  EXPECT_GT(high, 400);
  EXPECT_LT(high, 600);
}

}  // namespace
}  // namespace downpour
