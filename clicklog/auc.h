// Accuracy figures of a click model: ROC AUC and log loss, empirical (on
// labels) and expected (labels integrated out, for the planted model).
//
//   double auc = Auc(scores, labels);          // scores: any monotone score
//   double ll = LogLoss(probabilities, labels);
//   double best = ExpectedAuc(true_probabilities);
//
// Pure functions; thread-safe.
#ifndef DOWNPOUR_CLICKLOG_AUC_H_
#define DOWNPOUR_CLICKLOG_AUC_H_

#include "absl/types/span.h"

namespace downpour {
namespace clicklog {

// The probability that a random positive scores above a random negative
// (ties count one half): the Mann-Whitney statistic, O(n log n). 0.5 when
// either class is empty. Labels are 0 or 1 (anything > 0.5 is a 1).
// REQUIRES: scores.size() == labels.size(); no NaN score.
double Auc(absl::Span<const float> scores, absl::Span<const float> labels);

// Mean binary cross-entropy in nats, probabilities clamped to
// [1e-7, 1 - 1e-7]. 0 for no rows.
double LogLoss(absl::Span<const float> probabilities,
               absl::Span<const float> labels);

// The AUC that scoring rows by p reaches when each row's label is 1 with
// probability p, independently: E[sum over pairs i != j of
// p_i (1 - p_j) [p_i > p_j] (ties 1/2)] / E[sum over pairs i != j of
// p_i (1 - p_j)]. On a sample of rows this estimates the population AUC of
// the true probabilities (the best any model can reach) without the noise
// of drawn labels. O(n log n).
double ExpectedAuc(absl::Span<const double> p);

// The mean entropy of Bernoulli(p) in nats: the expected log loss of the
// true probabilities, the least any model can reach.
double ExpectedLogLoss(absl::Span<const double> p);

}  // namespace clicklog
}  // namespace downpour

#endif  // DOWNPOUR_CLICKLOG_AUC_H_
