// ParseLibsvm and GenerateClickData.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <sstream>

#include "common/test_util.h"
#include "models/dataset.h"

namespace downpour {
namespace {

using ::testing::HasSubstr;

absl::StatusOr<SparseDataset> Parse(const std::string& text) {
  std::istringstream in(text);
  return ParseLibsvm(in);
}

TEST(ParseLibsvm, GoodLines) {
  auto d = Parse(
      "1 3:0.5 10:1\n"
      "\n"
      "# a comment line\n"
      "-1 7:2e-1\t8:-3   # trailing comment\n"
      "+1\n"                          // a row with no features
      "0 18446744073709551615:1\r\n"  // largest id, Windows line end
      "1.0 2:1");                     // no final newline
  ASSERT_OK(d);
  EXPECT_EQ(d->NumRows(), 5u);
  EXPECT_EQ(d->labels, (std::vector<float>{1, 0, 1, 0, 1}));
  EXPECT_EQ(d->row_offsets, (std::vector<size_t>{0, 2, 4, 4, 5, 6}));
  EXPECT_EQ(d->feature_ids,
            (std::vector<uint64_t>{3, 10, 7, 8, UINT64_MAX, 2}));
  EXPECT_EQ(d->feature_values, (std::vector<float>{0.5f, 1, 0.2f, -3, 1, 1}));
}

TEST(ParseLibsvm, EmptyInputIsNoRows) {
  auto d = Parse("");
  ASSERT_OK(d);
  EXPECT_EQ(d->NumRows(), 0u);
  EXPECT_EQ(d->row_offsets, std::vector<size_t>{0});
}

TEST(ParseLibsvm, BadLinesNameTheLine) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"2 1:1", "bad label '2'"},
      {"yes 1:1", "bad label 'yes'"},
      {"0.5 1:1", "bad label"},
      {"1 1:1 2", "bad feature '2'"},
      {"1 :1", "bad feature ':1'"},
      {"1 1:", "bad feature '1:'"},
      {"1 -1:1", "bad feature '-1:1'"},
      {"1 +1:1", "bad feature '+1:1'"},
      {"1 x:1", "bad feature 'x:1'"},
      {"1 1:abc", "bad feature '1:abc'"},
      {"1 1:nan", "bad feature '1:nan'"},
      {"1 1:inf", "bad feature '1:inf'"},
      {"1 18446744073709551616:1", "bad feature"},  // 2^64
      {"1 4:1 5:1 4:2", "feature id 4 repeated"},
  };
  for (const auto& [line, why] : cases) {
    // Two good lines and a blank one first: the error names line 4.
    auto d = Parse("1 1:1\n0 2:1\n\n" + line + "\n1 3:1\n");
    EXPECT_THAT(d, StatusIs(absl::StatusCode::kInvalidArgument)) << line;
    EXPECT_THAT(std::string(d.status().message()), HasSubstr("line 4: "))
        << line;
    EXPECT_THAT(std::string(d.status().message()), HasSubstr(why)) << line;
  }
}

TEST(GenerateClickData, ShapeAndDeterminism) {
  const SparseDataset d = GenerateClickData(1000, 20, 5000, 1.1, 42);
  ASSERT_EQ(d.NumRows(), 1000u);
  ASSERT_EQ(d.row_offsets.size(), 1001u);
  EXPECT_EQ(d.row_offsets.front(), 0u);
  EXPECT_EQ(d.row_offsets.back(), d.feature_ids.size());
  EXPECT_EQ(d.feature_values.size(), d.feature_ids.size());
  for (size_t r = 0; r < d.NumRows(); ++r) {
    const size_t len = d.row_offsets[r + 1] - d.row_offsets[r];
    EXPECT_EQ(len, 20u);
    // Distinct, sorted ids within a row.
    for (size_t f = d.row_offsets[r] + 1; f < d.row_offsets[r + 1]; ++f) {
      EXPECT_LT(d.feature_ids[f - 1], d.feature_ids[f]);
    }
  }
  for (uint64_t id : d.feature_ids) EXPECT_LT(id, 5000u);
  for (float v : d.feature_values) EXPECT_EQ(v, 1.0f);
  double positives = 0;
  for (float y : d.labels) {
    EXPECT_TRUE(y == 0.0f || y == 1.0f);
    positives += y;
  }
  // Labels are neither constant nor extremely skewed.
  EXPECT_GT(positives / d.NumRows(), 0.15);
  EXPECT_LT(positives / d.NumRows(), 0.85);

  const SparseDataset again = GenerateClickData(1000, 20, 5000, 1.1, 42);
  EXPECT_EQ(again.feature_ids, d.feature_ids);
  EXPECT_EQ(again.labels, d.labels);
  const SparseDataset other = GenerateClickData(1000, 20, 5000, 1.1, 43);
  EXPECT_NE(other.feature_ids, d.feature_ids);
}

struct Frequencies {
  double top_share;           // share of occurrences held by the top 1% of ids
  double distinct;            // distinct ids seen
  std::vector<double> by_id;  // occurrence count of each id
};

Frequencies Count(const SparseDataset& d, uint64_t num_features) {
  Frequencies f;
  f.by_id.assign(num_features, 0);
  for (uint64_t id : d.feature_ids) f.by_id[id] += 1;
  std::vector<double> sorted = f.by_id;
  std::sort(sorted.begin(), sorted.end(), std::greater<double>());
  double top = 0, total = 0;
  const size_t top_n = num_features / 100;
  for (size_t i = 0; i < sorted.size(); ++i) {
    if (i < top_n) top += sorted[i];
    total += sorted[i];
  }
  f.top_share = top / total;
  f.distinct = std::count_if(sorted.begin(), sorted.end(),
                             [](double c) { return c > 0; });
  return f;
}

// Least-squares slope of log(count) against log(id + 1) over ids
// [first, last); -exponent for a Zipf law.
double LogLogSlope(const std::vector<double>& count, int first, int last) {
  double sx = 0, sy = 0, sxx = 0, sxy = 0;
  const int n = last - first;
  for (int i = first; i < last; ++i) {
    const double x = std::log(i + 1.0), y = std::log(count[i]);
    sx += x;
    sy += y;
    sxx += x * x;
    sxy += x * y;
  }
  return (n * sxy - sx * sy) / (n * sxx - sx * sx);
}

TEST(GenerateClickData, FeatureFrequenciesFollowAPowerLaw) {
  constexpr uint64_t kFeatures = 100000;
  const SparseDataset d = GenerateClickData(20000, 20, kFeatures, 1.1, 7);
  const Frequencies f = Count(d, kFeatures);
  // For Zipf(1.1) over 1e5 ids the top 1% of ids carry about 70% of the
  // draws; uniform ids would give about 1%.
  EXPECT_GT(f.top_share, 0.6) << f.top_share;
  // The frequency of id k falls as (k + 1)^-1.1. The fit skips the first
  // ids, which appear in most rows and saturate at one per row, and stops
  // where counts (about 30 at id 1000) get noisy.
  const double slope = LogLogSlope(f.by_id, 20, 1000);
  std::printf("Zipf(1.1): top 1%% of ids hold %.3f of draws, slope %.3f\n",
              f.top_share, slope);
  EXPECT_GT(slope, -1.3) << slope;
  EXPECT_LT(slope, -0.9) << slope;
  // The most frequent ids are the smallest.
  EXPECT_GT(f.by_id[0], f.by_id[9]);
  EXPECT_GT(f.by_id[9], f.by_id[99]);
  EXPECT_GT(f.by_id[99], f.by_id[999]);
}

// The same measure on exponent 0 (uniform ids) and a steeper law: the
// power-law test above can fail, and the exponent is honoured.
TEST(GenerateClickData, ExponentControlsTheSkew) {
  constexpr uint64_t kFeatures = 100000;
  const Frequencies uniform =
      Count(GenerateClickData(20000, 20, kFeatures, 0.0, 7), kFeatures);
  const Frequencies steep =
      Count(GenerateClickData(20000, 20, kFeatures, 2.0, 7), kFeatures);
  // Exponent exactly 1 is a special case of the sampler's formulas.
  const Frequencies one =
      Count(GenerateClickData(20000, 20, kFeatures, 1.0, 7), kFeatures);
  const double steep_slope = LogLogSlope(steep.by_id, 10, 100);
  const double one_slope = LogLogSlope(one.by_id, 20, 1000);
  std::printf(
      "uniform: top 1%% share %.3f; Zipf(2) slope %.3f; Zipf(1) slope %.3f\n",
      uniform.top_share, steep_slope, one_slope);
  EXPECT_LT(uniform.top_share, 0.05);
  EXPECT_GT(uniform.distinct, 0.9 * kFeatures);
  EXPECT_GT(steep_slope, -2.3);
  EXPECT_LT(steep_slope, -1.7);
  EXPECT_GT(one_slope, -1.2);
  EXPECT_LT(one_slope, -0.8);
}

TEST(GenerateClickData, HugeIdSpace) {
  // Ids up to 2^64 - 1 need no table; rare ids are spread over the range.
  const SparseDataset d = GenerateClickData(200, 10, UINT64_MAX, 1.05, 3);
  EXPECT_EQ(d.NumRows(), 200u);
  const uint64_t biggest =
      *std::max_element(d.feature_ids.begin(), d.feature_ids.end());
  EXPECT_GT(biggest, uint64_t{1} << 32);
}

}  // namespace
}  // namespace downpour
