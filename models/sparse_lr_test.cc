// The sparse_lr pieces a worker uses: data sharding, the feature-id to key
// mapping, row selection, held-out evaluation and libsvm files. The worker
// daemon itself is tested through real processes (tests/training_test.cc,
// tests/sparse_training_test.cc).
#include "models/sparse_lr.h"

#include <algorithm>
#include <cmath>
#include <fstream>
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
        const std::vector<size_t> mine =
            SparseTrainRows(rows, rank, workers, 42);
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

// Rows: {1:1 5:2} y=1, {5:1} y=0, {7:1} y=1.
SparseDataset ThreeRows() {
  SparseDataset d;
  d.feature_ids = {1, 5, 5, 7};
  d.feature_values = {1, 2, 1, 1};
  d.row_offsets = {0, 2, 3, 4};
  d.labels = {1, 0, 1};
  return d;
}

TEST(SelectRowsTest, PicksRowsInTheGivenOrder) {
  const SparseDataset d = ThreeRows();
  const SparseDataset s = SelectRows(d, {2, 0, 2});
  EXPECT_EQ(s.NumRows(), 3u);
  EXPECT_EQ(s.feature_ids, (std::vector<uint64_t>{7, 1, 5, 7}));
  EXPECT_EQ(s.feature_values, (std::vector<float>{1, 1, 2, 1}));
  EXPECT_EQ(s.row_offsets, (std::vector<size_t>{0, 1, 3, 4}));
  EXPECT_EQ(s.labels, (std::vector<float>{1, 1, 1}));
  EXPECT_EQ(SelectRows(d, {}).NumRows(), 0u);
}

TEST(EvaluateSparseLogRegTest, KnownLossAccuracyAndAuc) {
  const SparseDataset d = ThreeRows();
  // Logits: row 0: 1 * 1 + 2 * -1 = -1, row 1: -1, row 2: 0 (id 7 absent).
  const std::vector<uint64_t> ids = {1, 5};
  const std::vector<float> w = {1, -1};
  const SparseEval e = EvaluateSparseLogReg(d, ids, w);
  const double softplus1 = std::log1p(std::exp(-1.0));  // softplus(-1)
  // Row 0: softplus(-1) + 1, row 1: softplus(-1), row 2: ln 2.
  EXPECT_NEAR(e.log_loss, (2 * softplus1 + 1 + std::log(2.0)) / 3, 1e-12);
  // z > 0 predicts 1: every row predicts 0; only row 1 is right.
  EXPECT_NEAR(e.accuracy, 1.0 / 3, 1e-12);
  // Scores: positives -1 (row 0) and 0 (row 2), negative -1 (row 1): the
  // tie counts half, so AUC = (0.5 + 1) / 2.
  EXPECT_NEAR(e.auc, 0.75, 1e-12);
  // One class only: AUC is 0.5 by convention.
  EXPECT_EQ(EvaluateSparseLogReg(SelectRows(d, {0, 2}), ids, w).auc, 0.5);
  EXPECT_EQ(EvaluateSparseLogReg(SparseDataset(), ids, w).log_loss, 0.0);
}

TEST(LoadLibsvmFileTest, ErrorsNameTheFile) {
  const std::string missing = TestTmpDir() + "/no-such.libsvm";
  auto none = LoadLibsvmFile(missing);
  EXPECT_THAT(none, StatusIs(absl::StatusCode::kNotFound));
  EXPECT_THAT(std::string(none.status().message()),
              ::testing::HasSubstr(missing));
  const std::string bad = TestTmpDir() + "/bad.libsvm";
  std::ofstream(bad) << "+1 1:1\n-1 x:1\n";
  auto parsed = LoadLibsvmFile(bad);
  EXPECT_THAT(parsed, StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(std::string(parsed.status().message()),
              ::testing::HasSubstr(bad + "': line 2"));
  const std::string good = TestTmpDir() + "/good.libsvm";
  std::ofstream(good) << "+1 1:1 5:2\n0 5:1\n";
  ASSERT_OK_AND_ASSIGN(SparseDataset d, LoadLibsvmFile(good));
  EXPECT_EQ(d.NumRows(), 2u);
  EXPECT_EQ(d.labels, (std::vector<float>{1, 0}));
}

}  // namespace
}  // namespace downpour
