#include "planner/order_stats.h"

#include <cmath>

namespace downpour {
namespace planner {

double NormalOrderStatistic(int k, int n) {
  if (n <= 1) return 0;
  // The density of X_(k:n) is C Phi^(k-1) (1 - Phi)^(n-k) phi, with
  // C = n! / ((k-1)! (n-k)!); Simpson's rule over [-9, 9], logs for the
  // powers so that large n neither overflows nor underflows.
  const double log_c =
      std::lgamma(n + 1.0) - std::lgamma(k * 1.0) - std::lgamma(n - k + 1.0);
  constexpr int kSteps = 4000;  // even
  constexpr double kLo = -9, kHi = 9;
  const double h = (kHi - kLo) / kSteps;
  double sum = 0;
  for (int i = 0; i <= kSteps; ++i) {
    const double x = kLo + i * h;
    const double phi = std::exp(-0.5 * x * x) / std::sqrt(2 * M_PI);
    const double cdf = 0.5 * std::erfc(-x / std::sqrt(2.0));
    double f = 0;
    if (cdf > 0 && cdf < 1) {
      f = x * phi *
          std::exp(log_c + (k - 1) * std::log(cdf) +
                   (n - k) * std::log1p(-cdf));
    }
    const double w = (i == 0 || i == kSteps) ? 1 : (i % 2 == 1 ? 4 : 2);
    sum += w * f;
  }
  return sum * h / 3;
}

}  // namespace planner
}  // namespace downpour
