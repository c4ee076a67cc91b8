// The shape of Criteo's click logs (the Kaggle display-advertising set) and
// the batch both the generator and the TSV reader fill.
//
//   std::vector<float> dense(rows * kNumDense), labels(rows);
//   std::vector<int64_t> cat(rows * kNumCategorical);
//   ClickBatchView out{rows, absl::MakeSpan(dense), absl::MakeSpan(cat),
//                      absl::MakeSpan(labels)};
//
// Row r's dense features are dense[r * 13 .. r * 13 + 12], stored as
// log(1 + max(x, 0)) of Criteo's integer counts x (missing: 0), the usual
// transform; its categorical ids are categorical[r * 26 .. r * 26 + 25],
// 64-bit ids (Criteo's 32-bit hex hashes, or the generator's ranks), with
// kMissingId for an empty field; labels[r] is 0 or 1 (a click).
#ifndef DOWNPOUR_CLICKLOG_CLICK_BATCH_H_
#define DOWNPOUR_CLICKLOG_CLICK_BATCH_H_

#include <array>
#include <cstddef>
#include <cstdint>

#include "absl/types/span.h"

namespace downpour {
namespace clicklog {

inline constexpr int kNumDense = 13;
inline constexpr int kNumCategorical = 26;

// Distinct ids per categorical field in Criteo Kaggle's 45.8M training
// rows (33,762,577 in all).
inline constexpr std::array<uint64_t, kNumCategorical> kCriteoCardinalities = {
    1460,  583,  10131227, 2202608, 305, 24,     12517,   633,   3,
    93145, 5683, 8351593,  3194,    27,  14992,  5461306, 10,    5652,
    2173,  4,    7046547,  18,      15,  286181, 105,     142572};

// The id of an empty categorical field (all bits set; -1 as an int64).
inline constexpr int64_t kMissingId = -1;

// Caller-owned storage for `rows` rows. dense holds rows * kNumDense
// floats, categorical rows * kNumCategorical ids, labels rows floats.
// Optional outputs (empty spans: not written): counts, rows * kNumDense raw
// integer counts before the log transform (what Criteo's TSV holds);
// probabilities, rows click probabilities of the generator's planted model.
struct ClickBatchView {
  size_t rows = 0;
  absl::Span<float> dense;
  absl::Span<int64_t> categorical;
  absl::Span<float> labels;
  absl::Span<int64_t> counts;
  absl::Span<double> probabilities;
};

}  // namespace clicklog
}  // namespace downpour

#endif  // DOWNPOUR_CLICKLOG_CLICK_BATCH_H_
