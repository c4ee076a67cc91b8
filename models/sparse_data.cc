// ParseLibsvm and GenerateClickData from dataset.h.
#include <algorithm>
#include <cmath>
#include <random>
#include <string>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "common/logging.h"
#include "common/random.h"
#include "models/dataset.h"

namespace downpour {
namespace {

absl::Status LineError(size_t line_no, absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat("line ", line_no, ": ", what));
}

// Appends the features of `tokens` (all but the label) to `d`.
absl::Status ParseFeatures(const std::vector<absl::string_view>& tokens,
                           size_t line_no, SparseDataset* d) {
  const size_t row_begin = d->feature_ids.size();
  for (size_t i = 1; i < tokens.size(); ++i) {
    const absl::string_view tok = tokens[i];
    const size_t colon = tok.find(':');
    uint64_t id;
    float value;
    // SimpleAtoi<uint64_t> rejects a minus sign; a '+' would slip through,
    // and "+3:1" is not something a libsvm writer produces.
    if (colon == absl::string_view::npos || colon == 0 || tok[0] == '+' ||
        !absl::SimpleAtoi(tok.substr(0, colon), &id) ||
        !absl::SimpleAtof(tok.substr(colon + 1), &value) ||
        !std::isfinite(value)) {
      return LineError(line_no,
                       absl::StrCat("bad feature '", tok,
                                    "' (want id:value, id an "
                                    "unsigned integer, value finite)"));
    }
    d->feature_ids.push_back(id);
    d->feature_values.push_back(value);
  }
  std::vector<uint64_t> ids(d->feature_ids.begin() + row_begin,
                            d->feature_ids.end());
  std::sort(ids.begin(), ids.end());
  const auto dup = std::adjacent_find(ids.begin(), ids.end());
  if (dup != ids.end()) {
    return LineError(line_no, absl::StrCat("feature id ", *dup, " repeated"));
  }
  return absl::OkStatus();
}

// Draws ranks k in [1, n] with P(k) proportional to k^-s in O(1) expected
// time and memory, so that n may be 2^64 - 1: rejection-inversion sampling
// (Hoermann and Derflinger 1996, as in Apache Commons'
// RejectionInversionZipfSampler). REQUIRES s > 0.
class ZipfSampler {
 public:
  ZipfSampler(double n, double s) : n_(n), s_(s) {
    h_integral_x1_ = HIntegral(1.5) - 1.0;
    h_integral_n_ = HIntegral(n_ + 0.5);
    cut_ = 2.0 - HIntegralInverse(HIntegral(2.5) - H(2.0));
  }

  uint64_t Sample(std::mt19937_64& rng) const {
    while (true) {
      const double u =
          h_integral_n_ + Uniform01(rng()) * (h_integral_x1_ - h_integral_n_);
      const double x = HIntegralInverse(u);
      double k = std::floor(x + 0.5);
      k = std::min(std::max(k, 1.0), n_);
      if (k - x <= cut_ || u >= HIntegral(k + 0.5) - H(k)) {
        // n = 2^64 - 1 rounds up to 2^64, which does not convert.
        if (k >= 0x1.0p64) return UINT64_MAX;
        return static_cast<uint64_t>(k);
      }
    }
  }

 private:
  double H(double x) const { return std::exp(-s_ * std::log(x)); }
  double HIntegral(double x) const {
    const double log_x = std::log(x);
    return Helper2((1.0 - s_) * log_x) * log_x;
  }
  double HIntegralInverse(double x) const {
    double t = x * (1.0 - s_);
    if (t < -1.0) t = -1.0;  // rounding near the end of the support
    return std::exp(Helper1(t) * x);
  }
  // log1p(x) / x and expm1(x) / x, with their limits near 0 (s near 1).
  static double Helper1(double x) {
    if (std::abs(x) > 1e-8) return std::log1p(x) / x;
    return 1.0 - x * (0.5 - x * (1.0 / 3.0 - 0.25 * x));
  }
  static double Helper2(double x) {
    if (std::abs(x) > 1e-8) return std::expm1(x) / x;
    return 1.0 + x * 0.5 * (1.0 + x * (1.0 / 3.0) * (1.0 + 0.25 * x));
  }

  const double n_, s_;
  double h_integral_x1_, h_integral_n_, cut_;
};

// The hidden weight of `id`: N(0, stddev^2), a pure function of (seed, id)
// so that no table of num_features weights is needed.
double TrueWeight(uint64_t seed, uint64_t id, double stddev) {
  const uint64_t h1 = SplitMix64(SplitMix64(seed) ^ id);
  const uint64_t h2 = SplitMix64(h1);
  const double u1 = static_cast<double>((h1 >> 11) + 1) * 0x1.0p-53;  // (0, 1]
  const double u2 = static_cast<double>(h2 >> 11) * 0x1.0p-53;
  return stddev * std::sqrt(-2.0 * std::log(u1)) *
         std::cos(2.0 * M_PI * u2);  // Box-Muller
}

}  // namespace

absl::StatusOr<SparseDataset> ParseLibsvm(std::istream& in) {
  SparseDataset d;
  d.row_offsets = {0};
  std::string line;
  size_t line_no = 0;
  while (std::getline(in, line)) {
    ++line_no;
    absl::string_view text = line;
    text = text.substr(0, text.find('#'));
    const std::vector<absl::string_view> tokens =
        absl::StrSplit(text, absl::ByAnyChar(" \t\r\v\f"), absl::SkipEmpty());
    if (tokens.empty()) continue;
    absl::string_view label = tokens[0];
    if (!label.empty() && label[0] == '+') label.remove_prefix(1);
    double y;
    if (!absl::SimpleAtod(label, &y) || !(y == 1.0 || y == 0.0 || y == -1.0)) {
      return LineError(line_no, absl::StrCat("bad label '", tokens[0],
                                             "' (want 1, +1, 0 or -1)"));
    }
    absl::Status st = ParseFeatures(tokens, line_no, &d);
    if (!st.ok()) return st;
    d.labels.push_back(y == 1.0 ? 1.0f : 0.0f);
    d.row_offsets.push_back(d.feature_ids.size());
  }
  if (in.bad()) {
    return absl::DataLossError(absl::StrCat("read error after line ", line_no));
  }
  return d;
}

SparseDataset GenerateClickData(size_t rows, size_t features_per_row,
                                uint64_t num_features, double zipf_exponent,
                                uint64_t seed) {
  DP_CHECK(features_per_row >= 1 && num_features >= 1 && zipf_exponent >= 0)
      << "features_per_row " << features_per_row << " num_features "
      << num_features << " zipf_exponent " << zipf_exponent;
  std::mt19937_64 rng(SplitMix64(seed ^ 0x636c69636bULL));
  const ZipfSampler zipf(static_cast<double>(num_features),
                         std::max(zipf_exponent, 1e-12));
  const bool uniform = zipf_exponent == 0;
  // The logit's standard deviation is about 2.5 whatever the row length:
  // large enough that labels are mostly predictable (a perfect model is
  // right about 80% of the time), small enough that they are not
  // deterministic.
  const double stddev = 2.5 / std::sqrt(static_cast<double>(features_per_row));
  SparseDataset d;
  d.row_offsets = {0};
  d.row_offsets.reserve(rows + 1);
  d.labels.reserve(rows);
  d.feature_ids.reserve(rows * features_per_row);
  // Rows draw until they have features_per_row distinct ids, as a click
  // log row has one value per field; the cap ends the search when the ids
  // cannot be found (num_features too small, or the law so steep that the
  // head is all that comes up).
  const size_t max_draws = 10 * features_per_row + 100;
  std::vector<uint64_t> row;
  absl::flat_hash_set<uint64_t> in_row;
  for (size_t r = 0; r < rows; ++r) {
    row.clear();
    in_row.clear();
    for (size_t draw = 0; draw < max_draws && row.size() < features_per_row;
         ++draw) {
      // The sampler works in doubles, which cannot name every id above
      // 2^53; the clamp keeps such ranks in range.
      const uint64_t id = std::min(
          num_features - 1,
          uniform ? static_cast<uint64_t>(Uniform01(rng()) *
                                          static_cast<double>(num_features))
                  : zipf.Sample(rng) - 1);
      if (in_row.insert(id).second) row.push_back(id);
    }
    std::sort(row.begin(), row.end());
    double z = 0;
    for (uint64_t id : row) {
      z += TrueWeight(seed, id, stddev);
      d.feature_ids.push_back(id);
      d.feature_values.push_back(1.0f);
    }
    d.row_offsets.push_back(d.feature_ids.size());
    const double p = 1.0 / (1.0 + std::exp(-z));
    d.labels.push_back(Uniform01(rng()) < p ? 1.0f : 0.0f);
  }
  return d;
}

}  // namespace downpour
