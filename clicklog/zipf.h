// ZipfSampler: draws ranks k in [0, n) with P(k) proportional to
// (k + 1)^-exponent (rank 0 the most frequent), exactly, in O(1) expected
// time and O(min(n, kHeadRanks)) memory whatever n is:
//
//   ZipfSampler zipf(/*n=*/10'000'000, /*exponent=*/1.1);
//   uint64_t k = zipf.Sample(bits, &next);  // `next` supplies more bits
//
// The head (the kHeadRanks most frequent ranks, which carry most of the
// mass: 73% of a 10M-id field's at exponent 1.1) is an alias table
// (Walker/Vose: one 64-bit draw, one lookup; 32 KB, so that it stays in
// cache: a 2^16-entry table made every draw a cache miss, 3x slower);
// one more alias entry stands for the tail, which is sampled by
// rejection-inversion (Hörmann and Derflinger 1996, as in Apache Commons'
// RejectionInversionZipfSampler) restricted to [kHeadRanks, n). The tail's
// total mass comes from the Euler-Maclaurin formula, exact to double
// rounding at these ranks. Deterministic: the same bits give the same rank
// on every platform with IEEE doubles and a correctly rounded libm (exp,
// log, log1p, expm1 differ by at most an ulp elsewhere, which can move a
// tail draw by one rank).
//
// Immutable after construction; thread-safe.
#ifndef DOWNPOUR_CLICKLOG_ZIPF_H_
#define DOWNPOUR_CLICKLOG_ZIPF_H_

#include <cstdint>
#include <vector>

namespace downpour {
namespace clicklog {

class ZipfSampler {
 public:
  // Ranks held in the alias table; the rest are the tail.
  static constexpr uint64_t kHeadRanks = 1 << 12;

  // REQUIRES: n >= 1, exponent finite and >= 0 (0: uniform).
  ZipfSampler(uint64_t n, double exponent);

  // A rank in [0, n). `bits` is a uniform 64-bit word; a tail draw may need
  // more, which it takes from `more()` (a generator of uniform words).
  template <typename More>
  uint64_t Sample(uint64_t bits, More&& more) const {
    // Multiply-shift maps the high 32 bits onto the entries (bias below
    // 2^-19 for the largest table, far under what a test could see); the
    // low 32 bits pick the entry or its alias.
    const uint64_t i = ((bits >> 32) * entries_) >> 32;
    const uint32_t low = static_cast<uint32_t>(bits);
    const Entry& entry = table_[i];
    const uint32_t pick =
        low < entry.threshold ? static_cast<uint32_t>(i) : entry.alias;
    if (pick < head_) return pick;
    return SampleTail(more);
  }

  uint64_t n() const { return n_; }
  double exponent() const { return exponent_; }
  // P(rank k), exactly as sampled (from the normalizing constant).
  double Probability(uint64_t k) const;
  // P(rank >= kHeadRanks): how often Sample takes the slow path.
  double TailProbability() const { return tail_mass_ / total_mass_; }

 private:
  template <typename More>
  uint64_t SampleTail(More&& more) const {
    while (true) {
      const double u01 = static_cast<double>(more() >> 11) * 0x1.0p-53;
      const double u = h_integral_n_ + u01 * (h_integral_low_ - h_integral_n_);
      const double x = HIntegralInverse(u);
      double kd = x + 0.5;
      if (kd < static_cast<double>(tail_low_)) {
        kd = static_cast<double>(tail_low_);
      } else if (kd > static_cast<double>(n_)) {
        kd = static_cast<double>(n_);
      }
      const uint64_t k = static_cast<uint64_t>(kd);  // 1-based rank
      const double kk = static_cast<double>(k);
      if (kk - x <= squeeze_ || u >= HIntegral(kk + 0.5) - H(kk)) {
        return k - 1;
      }
    }
  }

  // h(x) = x^-exponent over 1-based ranks and its integral, in the forms
  // of Hörmann and Derflinger that stay accurate near exponent 1.
  double H(double x) const;
  double HIntegral(double x) const;
  double HIntegralInverse(double x) const;

  uint64_t n_;
  double exponent_;
  uint32_t head_;     // ranks in the alias table: min(n, kHeadRanks)
  uint64_t entries_;  // head_, plus one for the tail if there is one
  // An alias-table entry: keep i if the low word is below threshold, else
  // take alias. Together so that a draw touches one cache line.
  struct Entry {
    uint32_t threshold;
    uint32_t alias;
  };
  std::vector<Entry> table_;
  double head_mass_ = 0, tail_mass_ = 0, total_mass_ = 0;
  // The tail, in 1-based ranks [tail_low_, n_].
  uint64_t tail_low_ = 0;
  double h_integral_low_ = 0, h_integral_n_ = 0, squeeze_ = 0;
};

}  // namespace clicklog
}  // namespace downpour

#endif  // DOWNPOUR_CLICKLOG_ZIPF_H_
