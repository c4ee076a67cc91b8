#include "clicklog/zipf.h"

#include <algorithm>
#include <cmath>

#include "common/logging.h"

namespace downpour {
namespace clicklog {
namespace {

// log1p(x) / x and expm1(x) / x, with their series near 0 (Hörmann and
// Derflinger's helper1 and helper2), so that exponent 1 needs no special
// case.
double Log1pOverX(double x) {
  if (std::abs(x) > 1e-8) return std::log1p(x) / x;
  return 1.0 - x * (0.5 - x * (1.0 / 3.0 - 0.25 * x));
}

double Expm1OverX(double x) {
  if (std::abs(x) > 1e-8) return std::expm1(x) / x;
  return 1.0 + x * 0.5 * (1.0 + x * (1.0 / 3.0) * (1.0 + 0.25 * x));
}

}  // namespace

double ZipfSampler::H(double x) const {
  return std::exp(-exponent_ * std::log(x));
}

// The integral of h from 1 to x: (x^(1 - e) - 1) / (1 - e), or log x for
// e = 1.
double ZipfSampler::HIntegral(double x) const {
  const double log_x = std::log(x);
  return Expm1OverX((1.0 - exponent_) * log_x) * log_x;
}

double ZipfSampler::HIntegralInverse(double x) const {
  double t = x * (1.0 - exponent_);
  if (t < -1.0) t = -1.0;  // rounding at the domain's edge
  return std::exp(Log1pOverX(t) * x);
}

ZipfSampler::ZipfSampler(uint64_t n, double exponent)
    : n_(n), exponent_(exponent) {
  DP_CHECK(n >= 1) << "a Zipf distribution needs n >= 1";
  DP_CHECK(std::isfinite(exponent) && exponent >= 0)
      << "Zipf exponent " << exponent;
  head_ = static_cast<uint32_t>(std::min<uint64_t>(n, kHeadRanks));
  const bool has_tail = n > head_;
  entries_ = head_ + (has_tail ? 1 : 0);

  std::vector<double> weight(entries_);
  for (uint32_t k = 0; k < head_; ++k) {
    weight[k] = H(static_cast<double>(k) + 1.0);
    head_mass_ += weight[k];
  }
  if (has_tail) {
    // Euler-Maclaurin over the 1-based ranks [a, b]: the integral, the
    // trapezoid ends and two derivative terms. The next term is of order
    // a^(-e-5) < 1e-19 relative for a = 2^12 + 1.
    const double a = static_cast<double>(head_) + 1.0;
    const double b = static_cast<double>(n);
    const double e = exponent_;
    auto d1 = [e](double x) { return -e * std::pow(x, -e - 1.0); };
    auto d3 = [e](double x) {
      return -e * (e + 1.0) * (e + 2.0) * std::pow(x, -e - 3.0);
    };
    tail_mass_ = (HIntegral(b) - HIntegral(a)) + 0.5 * (H(a) + H(b)) +
                 (d1(b) - d1(a)) / 12.0 - (d3(b) - d3(a)) / 720.0;
    weight[head_] = tail_mass_;
    tail_low_ = head_ + 1;
    h_integral_low_ = HIntegral(a + 0.5) - H(a);
    h_integral_n_ = HIntegral(b + 0.5);
    squeeze_ = (a + 1.0) - HIntegralInverse(HIntegral(a + 1.5) - H(a + 1.0));
  }
  total_mass_ = head_mass_ + tail_mass_;

  // Vose's alias method. An entry whose scaled weight reaches 1 is its own
  // alias (so the threshold need not represent 1).
  table_.assign(entries_, Entry{0, 0});
  std::vector<double> scaled(entries_);
  std::vector<uint32_t> small, large;
  for (uint64_t i = 0; i < entries_; ++i) {
    scaled[i] = weight[i] * static_cast<double>(entries_) / total_mass_;
    table_[i].alias = static_cast<uint32_t>(i);
    (scaled[i] < 1.0 ? small : large).push_back(static_cast<uint32_t>(i));
  }
  while (!small.empty() && !large.empty()) {
    const uint32_t s = small.back();
    small.pop_back();
    const uint32_t l = large.back();
    table_[s].threshold =
        static_cast<uint32_t>(std::min(scaled[s] * 4294967296.0, 4294967295.0));
    table_[s].alias = l;
    scaled[l] -= 1.0 - scaled[s];
    if (scaled[l] < 1.0) {
      large.pop_back();
      small.push_back(l);
    }
  }
  // What is left has weight 1 up to rounding: always itself.
  for (uint32_t i : small) table_[i] = Entry{0, i};
  for (uint32_t i : large) table_[i] = Entry{0, i};
}

double ZipfSampler::Probability(uint64_t k) const {
  if (k >= n_) return 0;
  return H(static_cast<double>(k) + 1.0) / total_mass_;
}

}  // namespace clicklog
}  // namespace downpour
