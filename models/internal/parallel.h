// Splitting a loop over rows between a few short-lived threads; used by the
// dense models. Internal to models/.
#ifndef DOWNPOUR_MODELS_INTERNAL_PARALLEL_H_
#define DOWNPOUR_MODELS_INTERNAL_PARALLEL_H_

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <system_error>
#include <thread>
#include <vector>

namespace downpour {
namespace models_internal {

// Below this much work a part does not repay starting a thread for it
// (tens of microseconds to start and join one).
constexpr double kMinFlopsPerPart = 2e6;

// How many parts, at most `threads`, to split `n` rows of `flops_per_row`
// work each into: each part gets at least kMinFlopsPerPart of work, and
// there is always at least one part.
inline int NumParts(int threads, int64_t n, double flops_per_row) {
  const double min_rows =
      std::max(1.0, std::ceil(kMinFlopsPerPart / std::max(flops_per_row, 1.0)));
  const double parts = std::floor(static_cast<double>(n) / min_rows);
  return static_cast<int>(std::max(1.0, std::min<double>(threads, parts)));
}

// Start of part `p` of `parts` contiguous, near-equal ranges of [0, n).
inline int64_t PartBegin(int p, int parts, int64_t n) { return n * p / parts; }

// Calls fn(p, PartBegin(p), PartBegin(p + 1)) for p in [0, parts): part 0 on
// the calling thread, the others on threads started here. Blocks until all
// return. If the system refuses a thread, its part runs on the calling
// thread instead, so the result never depends on thread availability.
inline void ParallelFor(int parts, int64_t n,
                        const std::function<void(int, int64_t, int64_t)>& fn) {
  std::vector<std::thread> threads;
  std::vector<int> refused;
  for (int p = 1; p < parts; ++p) {
    try {
      threads.emplace_back(fn, p, PartBegin(p, parts, n),
                           PartBegin(p + 1, parts, n));
    } catch (const std::system_error&) {
      refused.push_back(p);
    }
  }
  fn(0, 0, PartBegin(1, parts, n));
  for (int p : refused)
    fn(p, PartBegin(p, parts, n), PartBegin(p + 1, parts, n));
  for (std::thread& t : threads) t.join();
}

}  // namespace models_internal
}  // namespace downpour

#endif  // DOWNPOUR_MODELS_INTERNAL_PARALLEL_H_
