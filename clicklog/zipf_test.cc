#include "clicklog/zipf.h"

#include <cmath>
#include <vector>

#include "common/random.h"
#include "common/test_util.h"

namespace downpour {
namespace clicklog {
namespace {

// A stream of uniform words for the sampler.
class Words {
 public:
  explicit Words(uint64_t seed) : counter_(seed) {}
  uint64_t operator()() { return SplitMix64(counter_++); }

 private:
  uint64_t counter_;
};

// sum_{k=first}^{last} k^-s over 1-based ranks, summed from the small terms
// up (Kahan), independently of the sampler's closed forms.
double DirectMass(uint64_t first, uint64_t last, double s) {
  double sum = 0, c = 0;
  for (uint64_t k = last; k >= first; --k) {
    const double y = std::pow(static_cast<double>(k), -s) - c;
    const double t = sum + y;
    c = (t - sum) - y;
    sum = t;
    if (k == 1) break;
  }
  return sum;
}

// |observed - expected| within 5 standard deviations of a binomial count.
void ExpectCount(uint64_t observed, double p, uint64_t draws,
                 const std::string& what) {
  const double mean = p * static_cast<double>(draws);
  const double sd = std::sqrt(mean * (1 - p)) + 1;
  EXPECT_NEAR(static_cast<double>(observed), mean, 5 * sd) << what;
}

TEST(ZipfTest, SmallSupportMatchesThePmf) {
  for (double s : {0.0, 0.5, 1.0, 1.1, 2.0}) {
    SCOPED_TRACE(s);
    ZipfSampler zipf(10, s);
    const double total = DirectMass(1, 10, s);
    constexpr uint64_t kDraws = 500000;
    std::vector<uint64_t> counts(10);
    Words words(42);
    for (uint64_t i = 0; i < kDraws; ++i) {
      const uint64_t k = zipf.Sample(words(), words);
      ASSERT_LT(k, 10u);
      ++counts[k];
    }
    for (uint64_t k = 0; k < 10; ++k) {
      const double p = std::pow(k + 1.0, -s) / total;
      EXPECT_NEAR(zipf.Probability(k), p, 1e-12);
      ExpectCount(counts[k], p, kDraws, "rank " + std::to_string(k));
    }
  }
}

// Criteo's largest field: the head from the alias table, the tail by
// rejection-inversion, both against directly summed masses.
TEST(ZipfTest, LargeSupportHeadAndTail) {
  constexpr uint64_t kN = 10131227;
  constexpr double kS = 1.1;
  ZipfSampler zipf(kN, kS);
  const double total = DirectMass(1, kN, kS);
  // The sampler's normalization (Euler-Maclaurin for the tail) agrees with
  // the direct sum.
  EXPECT_NEAR(zipf.Probability(0) * total, 1.0, 1e-12);
  const uint64_t head = ZipfSampler::kHeadRanks;
  EXPECT_NEAR(zipf.TailProbability(), DirectMass(head + 1, kN, kS) / total,
              1e-12);

  // Buckets of 0-based ranks: a few single head ranks, then ranges across
  // the head/tail boundary and out to the end.
  struct Bucket {
    uint64_t begin, end;
  };
  const std::vector<Bucket> buckets = {{0, 1},
                                       {1, 2},
                                       {2, 3},
                                       {9, 10},
                                       {10, 100},
                                       {100, head - 1000},
                                       {head - 1000, head},
                                       {head, head + 1000},
                                       {head + 1000, 1 << 20},
                                       {1 << 20, 1 << 22},
                                       {1 << 22, kN}};
  constexpr uint64_t kDraws = 2000000;
  std::vector<uint64_t> counts(buckets.size());
  Words words(7);
  for (uint64_t i = 0; i < kDraws; ++i) {
    const uint64_t k = zipf.Sample(words(), words);
    ASSERT_LT(k, kN);
    for (size_t b = 0; b < buckets.size(); ++b) {
      if (k >= buckets[b].begin && k < buckets[b].end) ++counts[b];
    }
  }
  for (size_t b = 0; b < buckets.size(); ++b) {
    const double p =
        DirectMass(buckets[b].begin + 1, buckets[b].end, kS) / total;
    ExpectCount(counts[b], p, kDraws,
                "ranks [" + std::to_string(buckets[b].begin) + ", " +
                    std::to_string(buckets[b].end) + ")");
  }
}

TEST(ZipfTest, ExponentOneWithATail) {
  constexpr uint64_t kN = 1 << 18;
  ZipfSampler zipf(kN, 1.0);
  const double total = DirectMass(1, kN, 1.0);
  EXPECT_NEAR(zipf.Probability(0) * total, 1.0, 1e-12);
  constexpr uint64_t kDraws = 500000;
  uint64_t tail = 0;
  Words words(3);
  for (uint64_t i = 0; i < kDraws; ++i) {
    const uint64_t k = zipf.Sample(words(), words);
    ASSERT_LT(k, kN);
    tail += k >= ZipfSampler::kHeadRanks;
  }
  ExpectCount(tail, DirectMass(ZipfSampler::kHeadRanks + 1, kN, 1.0) / total,
              kDraws, "tail");
}

TEST(ZipfTest, OneValueAndDeterminism) {
  ZipfSampler one(1, 1.1);
  Words w(1);
  for (int i = 0; i < 100; ++i) EXPECT_EQ(one.Sample(w(), w), 0u);
  ZipfSampler a(5000000, 1.1), b(5000000, 1.1);
  Words wa(9), wb(9);
  for (int i = 0; i < 10000; ++i) {
    ASSERT_EQ(a.Sample(wa(), wa), b.Sample(wb(), wb)) << i;
  }
}

}  // namespace
}  // namespace clicklog
}  // namespace downpour
