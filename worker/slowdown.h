// The --slow_factor straggler of tests and demos, shared by the training
// and the Sandblaster workers.
#ifndef DOWNPOUR_WORKER_SLOWDOWN_H_
#define DOWNPOUR_WORKER_SLOWDOWN_H_

#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace downpour {

// Sleeps so that the work begun at `start` takes `factor` times as long as
// it did; factor <= 1 does nothing.
inline void StretchStep(absl::Time start, double factor) {
  if (factor > 1.0) absl::SleepFor((absl::Now() - start) * (factor - 1.0));
}

}  // namespace downpour

#endif  // DOWNPOUR_WORKER_SLOWDOWN_H_
