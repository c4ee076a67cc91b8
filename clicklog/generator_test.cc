#include "clicklog/generator.h"

#include <cmath>
#include <cstring>
#include <vector>

#include "clicklog/auc.h"
#include "common/test_util.h"

namespace downpour {
namespace clicklog {
namespace {

struct Rows {
  explicit Rows(size_t n, bool with_probabilities = false)
      : dense(n * kNumDense),
        labels(n),
        cat(n * kNumCategorical),
        counts(n * kNumDense),
        p(with_probabilities ? n : 0) {
    view.rows = n;
    view.dense = absl::MakeSpan(dense);
    view.categorical = absl::MakeSpan(cat);
    view.labels = absl::MakeSpan(labels);
    view.counts = absl::MakeSpan(counts);
    view.probabilities = absl::MakeSpan(p);
  }
  bool operator==(const Rows& o) const {
    return dense == o.dense && labels == o.labels && cat == o.cat &&
           counts == o.counts;
  }
  std::vector<float> dense, labels;
  std::vector<int64_t> cat, counts;
  std::vector<double> p;
  ClickBatchView view;
};

std::unique_ptr<ClickLogGenerator> Make(uint64_t seed, double scale) {
  GeneratorOptions o;
  o.seed = seed;
  o.scale = scale;
  auto gen = ClickLogGenerator::Create(o);
  EXPECT_OK(gen);
  return std::move(gen).value();
}

TEST(GeneratorTest, SameSeedSameRows) {
  auto a = Make(5, 0.01), b = Make(5, 0.01), c = Make(6, 0.01);
  Rows ra(1000), rb(1000), rc(1000);
  a->Fill(0, 1, ra.view);
  b->Fill(0, 1, rb.view);
  c->Fill(0, 1, rc.view);
  EXPECT_TRUE(ra == rb);
  EXPECT_FALSE(ra == rc);
  // A row is a function of its index alone: row 500 on its own.
  Rows one(1);
  a->Fill(500, 1, one.view);
  EXPECT_EQ(0,
            std::memcmp(one.cat.data(), ra.cat.data() + 500 * kNumCategorical,
                        kNumCategorical * sizeof(int64_t)));
  EXPECT_EQ(one.labels[0], ra.labels[500]);
}

TEST(GeneratorTest, ShardsDealRowsByIndex) {
  auto gen = Make(1, 0.01);
  Rows all(300);
  gen->Fill(0, 1, all.view);
  constexpr int kShards = 3;
  for (int rank = 0; rank < kShards; ++rank) {
    ClickLogStream stream(gen.get(), rank, kShards);
    Rows first(40), second(60);
    stream.Next(first.view);
    stream.Next(second.view);
    EXPECT_EQ(stream.position(), 100u);
    for (int i = 0; i < 100; ++i) {
      const Rows& part = i < 40 ? first : second;
      const int j = i < 40 ? i : i - 40;
      const int row = i * kShards + rank;
      ASSERT_EQ(part.labels[j], all.labels[row]) << rank << " " << i;
      ASSERT_EQ(0, std::memcmp(part.cat.data() + j * kNumCategorical,
                               all.cat.data() + row * kNumCategorical,
                               kNumCategorical * sizeof(int64_t)));
    }
  }
  // A stream started at a position continues where another left off.
  ClickLogStream late(gen.get(), 1, kShards, 40);
  Rows next(60);
  late.Next(next.view);
  ClickLogStream early(gen.get(), 1, kShards);
  Rows skip(40), same(60);
  early.Next(skip.view);
  early.Next(same.view);
  EXPECT_EQ(next.cat, same.cat);
}

TEST(GeneratorTest, CardinalitiesAndIdRanges) {
  auto full = Make(1, 1.0);
  for (int f = 0; f < kNumCategorical; ++f) {
    EXPECT_EQ(full->cardinalities()[f], kCriteoCardinalities[f]);
  }
  auto small = Make(1, 0.01);
  uint64_t total = 0;
  for (int f = 0; f < kNumCategorical; ++f) {
    const uint64_t c = kCriteoCardinalities[f];
    const uint64_t want = std::max<uint64_t>(
        std::min<uint64_t>(c, 16), static_cast<uint64_t>(std::round(c * 0.01)));
    EXPECT_EQ(small->cardinalities()[f], want) << f;
    total += want;
  }
  EXPECT_EQ(total, 337754u);
  Rows rows(20000);
  small->Fill(0, 1, rows.view);
  for (size_t r = 0; r < rows.view.rows; ++r) {
    for (int f = 0; f < kNumCategorical; ++f) {
      const int64_t id = rows.cat[r * kNumCategorical + f];
      ASSERT_GE(id, 0);
      ASSERT_LT(static_cast<uint64_t>(id), small->cardinalities()[f]);
    }
    for (int j = 0; j < kNumDense; ++j) {
      const int64_t count = rows.counts[r * kNumDense + j];
      ASSERT_GE(count, 0);
      ASSERT_EQ(rows.dense[r * kNumDense + j],
                static_cast<float>(std::log1p(static_cast<double>(count))));
    }
    ASSERT_TRUE(rows.labels[r] == 0.0f || rows.labels[r] == 1.0f);
  }
}

// Field 2 (10M ids at full scale) follows its Zipf law: the share of the
// most frequent id and of the ids past the alias table's head.
TEST(GeneratorTest, IdsFollowThePowerLaw) {
  auto gen = Make(3, 1.0);
  ZipfSampler reference(kCriteoCardinalities[2], 1.1);
  constexpr size_t kRows = 200000;
  Rows rows(kRows);
  gen->Fill(0, 1, rows.view);
  double zeros = 0, tail = 0;
  for (size_t r = 0; r < kRows; ++r) {
    const int64_t id = rows.cat[r * kNumCategorical + 2];
    zeros += id == 0;
    tail += static_cast<uint64_t>(id) >= ZipfSampler::kHeadRanks;
  }
  const double p0 = reference.Probability(0);
  const double pt = reference.TailProbability();
  EXPECT_NEAR(zeros / kRows, p0, 5 * std::sqrt(p0 * (1 - p0) / kRows));
  EXPECT_NEAR(tail / kRows, pt, 5 * std::sqrt(pt * (1 - pt) / kRows));
}

TEST(GeneratorTest, HiddenWeightsArePureFunctions) {
  auto a = Make(11, 1.0), b = Make(11, 0.01), c = Make(12, 1.0);
  double sum = 0, sum_sq = 0;
  int differ = 0;
  constexpr int kIds = 100000;
  for (int id = 0; id < kIds; ++id) {
    const float w = a->IdWeight(4, id);
    ASSERT_EQ(w, b->IdWeight(4, id));  // scale does not change weights
    differ += w != c->IdWeight(4, id);
    sum += w;
    sum_sq += static_cast<double>(w) * w;
  }
  EXPECT_GT(differ, kIds * 0.99);
  EXPECT_NEAR(sum / kIds, 0.0, 0.005);
  EXPECT_NEAR(std::sqrt(sum_sq / kIds), a->options().id_weight_stddev, 0.005);
  EXPECT_NE(a->IdWeight(4, 9), a->IdWeight(5, 9));
}

// The best achievable AUC: the planted probabilities scored against the
// labels actually drawn, on training rows, agree with the expected AUC
// Planted() computes on other (held-out) rows. The standard deviation of
// an AUC on 300k rows with a 26% click rate is about 0.001; 0.006 is 6 of
// them. The same holds for the log loss.
TEST(GeneratorTest, PlantedModelAucMatchesItsExpectedValue) {
  auto gen = Make(2, 0.01);
  const PlantedStats planted = gen->Planted(1000000);
  // What the defaults are documented to give.
  EXPECT_GT(planted.auc, 0.78);
  EXPECT_LT(planted.auc, 0.85);
  EXPECT_GT(planted.click_rate, 0.22);
  EXPECT_LT(planted.click_rate, 0.30);

  constexpr size_t kRows = 300000;
  Rows rows(kRows, /*with_probabilities=*/true);
  gen->Fill(0, 1, rows.view);
  std::vector<float> p(rows.p.begin(), rows.p.end());
  EXPECT_NEAR(Auc(p, rows.labels), planted.auc, 0.006);
  EXPECT_NEAR(LogLoss(p, rows.labels), planted.log_loss, 0.006);
  double clicks = 0;
  for (float l : rows.labels) clicks += l;
  EXPECT_NEAR(clicks / kRows, planted.click_rate, 0.005);
}

TEST(GeneratorTest, BadOptions) {
  for (double scale : {0.0, -1.0, 1001.0, std::nan("")}) {
    GeneratorOptions o;
    o.scale = scale;
    EXPECT_THAT(ClickLogGenerator::Create(o),
                StatusIs(absl::StatusCode::kInvalidArgument))
        << scale;
  }
  GeneratorOptions o;
  o.zipf_exponent = -0.5;
  EXPECT_THAT(ClickLogGenerator::Create(o),
              StatusIs(absl::StatusCode::kInvalidArgument));
  o = GeneratorOptions();
  o.id_weight_stddev = INFINITY;
  EXPECT_THAT(ClickLogGenerator::Create(o),
              StatusIs(absl::StatusCode::kInvalidArgument));
  o = GeneratorOptions();
  o.bias = NAN;
  EXPECT_THAT(ClickLogGenerator::Create(o),
              StatusIs(absl::StatusCode::kInvalidArgument));
}

}  // namespace
}  // namespace clicklog
}  // namespace downpour
