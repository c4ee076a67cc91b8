#include "clicklog/auc.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "common/logging.h"

namespace downpour {
namespace clicklog {

double Auc(absl::Span<const float> scores, absl::Span<const float> labels) {
  DP_CHECK(scores.size() == labels.size())
      << scores.size() << " scores, " << labels.size() << " labels";
  const size_t n = scores.size();
  std::vector<uint32_t> order(n);
  std::iota(order.begin(), order.end(), 0u);
  std::sort(order.begin(), order.end(),
            [&](uint32_t a, uint32_t b) { return scores[a] < scores[b]; });
  // Sum of the positives' ranks (1-based, ties given their mean rank).
  double positives = 0, rank_sum = 0;
  for (size_t i = 0; i < n;) {
    size_t j = i;
    double tied_positives = 0;
    while (j < n && scores[order[j]] == scores[order[i]]) {
      tied_positives += labels[order[j]] > 0.5f ? 1 : 0;
      ++j;
    }
    const double mean_rank = 0.5 * static_cast<double>(i + 1 + j);
    rank_sum += tied_positives * mean_rank;
    positives += tied_positives;
    i = j;
  }
  const double negatives = static_cast<double>(n) - positives;
  if (positives == 0 || negatives == 0) return 0.5;
  return (rank_sum - positives * (positives + 1) / 2) / (positives * negatives);
}

double LogLoss(absl::Span<const float> probabilities,
               absl::Span<const float> labels) {
  DP_CHECK(probabilities.size() == labels.size());
  if (probabilities.empty()) return 0;
  double sum = 0;
  for (size_t i = 0; i < probabilities.size(); ++i) {
    const double p =
        std::clamp(static_cast<double>(probabilities[i]), 1e-7, 1 - 1e-7);
    sum -= labels[i] > 0.5f ? std::log(p) : std::log1p(-p);
  }
  return sum / static_cast<double>(probabilities.size());
}

double ExpectedAuc(absl::Span<const double> p) {
  std::vector<double> sorted(p.begin(), p.end());
  std::sort(sorted.begin(), sorted.end());
  // For each group of equal p: pairs (i positive, j negative) with p_j
  // below it count fully, pairs within the group one half (i != j).
  double below_negative = 0;  // sum of (1 - p_j) over p_j < current
  double numerator = 0, total_positive = 0, total_negative = 0, self = 0;
  const size_t n = sorted.size();
  for (size_t i = 0; i < n;) {
    size_t j = i;
    double group_positive = 0, group_negative = 0, group_self = 0;
    while (j < n && sorted[j] == sorted[i]) {
      group_positive += sorted[j];
      group_negative += 1 - sorted[j];
      group_self += sorted[j] * (1 - sorted[j]);
      ++j;
    }
    numerator += group_positive * below_negative +
                 0.5 * (group_positive * group_negative - group_self);
    below_negative += group_negative;
    total_positive += group_positive;
    total_negative += group_negative;
    self += group_self;
    i = j;
  }
  const double denominator = total_positive * total_negative - self;
  return denominator > 0 ? numerator / denominator : 0.5;
}

double ExpectedLogLoss(absl::Span<const double> p) {
  if (p.empty()) return 0;
  double sum = 0;
  for (double q : p) {
    if (q > 0 && q < 1) sum -= q * std::log(q) + (1 - q) * std::log1p(-q);
  }
  return sum / static_cast<double>(p.size());
}

}  // namespace clicklog
}  // namespace downpour
