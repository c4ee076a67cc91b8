// When a Wait on a lone operation spins before it sleeps (see
// ClientOptions::spin_wait): always, until a spin runs out; then the next
// lone waits sleep at once, 1 after the first spin that ran out, then 2,
// 4, ... up to kMaxSkips after each further one, until a spin succeeds.
// A client whose replies come later than the window (a loaded server,
// large requests, more busy threads than cores) so burns a spin in about
// one wait of kMaxSkips + 1, and one whose replies come in time spins on
// every wait.
#ifndef DOWNPOUR_CLIENT_INTERNAL_SPIN_BACKOFF_H_
#define DOWNPOUR_CLIENT_INTERNAL_SPIN_BACKOFF_H_

#include <algorithm>
#include <atomic>

namespace downpour {
namespace client_internal {

class SpinBackoff {
 public:
  static constexpr int kMaxSkips = 64;

  // Whether this wait spins; a wait that does not uses up one skip.
  // Thread-safe; concurrent waits may see each other's updates late,
  // which only shifts a skip from one wait to another.
  bool ShouldSpin() {
    if (skips_.load(std::memory_order_relaxed) <= 0) return true;
    skips_.fetch_sub(1, std::memory_order_relaxed);
    return false;
  }
  // The spin ran out before the reply came.
  void RanOut() {
    const int next = next_skips_.load(std::memory_order_relaxed);
    skips_.store(next, std::memory_order_relaxed);
    next_skips_.store(std::min(kMaxSkips, 2 * next), std::memory_order_relaxed);
  }
  // The reply came while spinning.
  void Succeeded() { next_skips_.store(1, std::memory_order_relaxed); }

 private:
  std::atomic<int> skips_{0};       // waits left that sleep at once
  std::atomic<int> next_skips_{1};  // after the next spin that runs out
};

}  // namespace client_internal
}  // namespace downpour

#endif  // DOWNPOUR_CLIENT_INTERNAL_SPIN_BACKOFF_H_
