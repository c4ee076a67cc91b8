#include "clicklog/generator.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "absl/strings/str_cat.h"
#include "clicklog/auc.h"
#include "common/logging.h"
#include "common/random.h"

namespace downpour {
namespace clicklog {
namespace {

// Salts that keep the generator's hash streams apart.
constexpr uint64_t kRowSalt = 0x726f77735f636c6bull;
constexpr uint64_t kIdWeightSalt = 0x69645f7765696768ull;
constexpr uint64_t kDenseWeightSalt = 0x64656e73655f7776ull;

// A roughly standard normal number from a hash: the sum of its four 16-bit
// parts (Irwin-Hall, n = 4: mean 2, variance 1/3 in units of 2^16),
// centered and scaled. No transcendental function, the same on every
// platform; bounded by +-3.46.
double HashNormal(uint64_t h) {
  const double sum = static_cast<double>((h & 0xffff) + ((h >> 16) & 0xffff) +
                                         ((h >> 32) & 0xffff) + (h >> 48));
  return (sum * (1.0 / 65536.0) - 2.0) * 1.7320508075688772;
}

// The words of one row: SplitMix64 of consecutive counters from a start
// that hashes (seed, row).
class RowWords {
 public:
  explicit RowWords(uint64_t start) : counter_(start) {}
  uint64_t operator()() { return SplitMix64(counter_++); }

 private:
  uint64_t counter_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<ClickLogGenerator>> ClickLogGenerator::Create(
    const GeneratorOptions& o) {
  if (!(o.scale > 0 && o.scale <= 1000)) {
    return absl::InvalidArgumentError(
        absl::StrCat("click-log scale ", o.scale, " outside (0, 1000]"));
  }
  if (!(std::isfinite(o.zipf_exponent) && o.zipf_exponent >= 0)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "click-log Zipf exponent ", o.zipf_exponent, " must be >= 0"));
  }
  if (!(std::isfinite(o.id_weight_stddev) && o.id_weight_stddev >= 0 &&
        std::isfinite(o.dense_weight_stddev) && o.dense_weight_stddev >= 0)) {
    return absl::InvalidArgumentError(
        "click-log planted weights: standard deviations must be finite and "
        ">= 0");
  }
  if (!std::isfinite(o.bias)) {
    return absl::InvalidArgumentError("click-log planted bias must be finite");
  }
  std::array<uint64_t, kNumCategorical> cards;
  for (int f = 0; f < kNumCategorical; ++f) {
    const uint64_t full = kCriteoCardinalities[f];
    const double scaled = std::round(static_cast<double>(full) * o.scale);
    cards[f] = std::max<uint64_t>(std::min<uint64_t>(full, 16),
                                  static_cast<uint64_t>(scaled));
  }
  return std::unique_ptr<ClickLogGenerator>(new ClickLogGenerator(o, cards));
}

ClickLogGenerator::ClickLogGenerator(
    const GeneratorOptions& o,
    const std::array<uint64_t, kNumCategorical>& cards)
    : options_(o), cardinalities_(cards) {
  const uint64_t seed_word = SplitMix64(o.seed);
  row_salt_ = SplitMix64(seed_word ^ kRowSalt);
  zipf_.reserve(kNumCategorical);
  for (int f = 0; f < kNumCategorical; ++f) {
    zipf_.emplace_back(cards[f], o.zipf_exponent);
    field_salt_[f] =
        SplitMix64(seed_word ^ kIdWeightSalt ^ static_cast<uint64_t>(f));
  }
  for (int j = 0; j < kNumDense; ++j) {
    // Equally likely levels at the quantiles (i + 1/2) / L of an
    // exponential law, floored to counts.
    dense_count_[j].resize(kDenseLevels);
    dense_value_[j].resize(kDenseLevels);
    double sum = 0, sum_sq = 0;
    for (int i = 0; i < kDenseLevels; ++i) {
      const double q = (i + 0.5) / kDenseLevels;
      const int64_t count =
          static_cast<int64_t>(std::floor(-kDenseMeans[j] * std::log1p(-q)));
      const float value = static_cast<float>(std::log1p(count));
      dense_count_[j][i] = count;
      dense_value_[j][i] = value;
      sum += value;
      sum_sq += static_cast<double>(value) * value;
    }
    dense_mean_[j] = sum / kDenseLevels;
    const double var = sum_sq / kDenseLevels - dense_mean_[j] * dense_mean_[j];
    dense_inv_std_[j] = var > 0 ? 1.0 / std::sqrt(var) : 0.0;
    dense_weight_[j] =
        static_cast<float>(o.dense_weight_stddev *
                           HashNormal(SplitMix64(seed_word ^ kDenseWeightSalt ^
                                                 static_cast<uint64_t>(j))));
  }
}

float ClickLogGenerator::IdWeight(int field, uint64_t id) const {
  return static_cast<float>(options_.id_weight_stddev *
                            HashNormal(SplitMix64(field_salt_[field] ^ id)));
}

double ClickLogGenerator::Logit(const float* dense,
                                const int64_t* categorical) const {
  double z = options_.bias;
  for (int f = 0; f < kNumCategorical; ++f) {
    z += IdWeight(f, static_cast<uint64_t>(categorical[f]));
  }
  for (int j = 0; j < kNumDense; ++j) {
    z += dense_weight_[j] * (dense[j] - dense_mean_[j]) * dense_inv_std_[j];
  }
  return z;
}

double ClickLogGenerator::Probability(const float* dense,
                                      const int64_t* categorical) const {
  return 1.0 / (1.0 + std::exp(-Logit(dense, categorical)));
}

void ClickLogGenerator::Fill(uint64_t first_row, uint64_t stride,
                             const ClickBatchView& out) const {
  DP_CHECK(stride >= 1);
  DP_CHECK(out.dense.size() >= out.rows * kNumDense &&
           out.categorical.size() >= out.rows * kNumCategorical &&
           out.labels.size() >= out.rows)
      << "batch spans too short for " << out.rows << " rows";
  DP_CHECK(out.counts.empty() || out.counts.size() >= out.rows * kNumDense);
  DP_CHECK(out.probabilities.empty() || out.probabilities.size() >= out.rows);
  for (size_t r = 0; r < out.rows; ++r) {
    const uint64_t row = first_row + r * stride;
    RowWords words(SplitMix64(row_salt_ ^ SplitMix64(row)));
    int64_t* cat = out.categorical.data() + r * kNumCategorical;
    float* dense = out.dense.data() + r * kNumDense;
    for (int f = 0; f < kNumCategorical; ++f) {
      cat[f] = static_cast<int64_t>(zipf_[f].Sample(words(), words));
    }
    for (int j = 0; j < kNumDense; ++j) {
      const uint64_t level = words() >> (64 - kDenseLevelBits);
      dense[j] = dense_value_[j][level];
      if (!out.counts.empty()) {
        out.counts[r * kNumDense + j] = dense_count_[j][level];
      }
    }
    const double p = Probability(dense, cat);
    out.labels[r] = Uniform01(words()) < p ? 1.0f : 0.0f;
    if (!out.probabilities.empty()) out.probabilities[r] = p;
  }
}

PlantedStats ClickLogGenerator::Planted(size_t rows) const {
  std::vector<float> dense(rows * kNumDense), labels(rows);
  std::vector<int64_t> cat(rows * kNumCategorical);
  std::vector<double> p(rows);
  ClickBatchView view;
  view.rows = rows;
  view.dense = absl::MakeSpan(dense);
  view.categorical = absl::MakeSpan(cat);
  view.labels = absl::MakeSpan(labels);
  view.probabilities = absl::MakeSpan(p);
  Fill(kHeldOutFirstRow, 1, view);
  PlantedStats stats;
  stats.auc = ExpectedAuc(p);
  stats.log_loss = ExpectedLogLoss(p);
  double sum = 0;
  for (double q : p) sum += q;
  stats.click_rate = rows ? sum / static_cast<double>(rows) : 0;
  return stats;
}

ClickLogStream::ClickLogStream(const ClickLogGenerator* generator, int rank,
                               int num_shards, uint64_t start)
    : generator_(generator),
      rank_(static_cast<uint64_t>(rank)),
      num_shards_(static_cast<uint64_t>(num_shards)),
      position_(start) {
  DP_CHECK(num_shards >= 1 && rank >= 0 && rank < num_shards)
      << "rank " << rank << " of " << num_shards;
}

void ClickLogStream::Next(const ClickBatchView& out) {
  generator_->Fill(position_ * num_shards_ + rank_, num_shards_, out);
  position_ += out.rows;
}

}  // namespace clicklog
}  // namespace downpour
