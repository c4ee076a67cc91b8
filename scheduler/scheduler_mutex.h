// The scheduler's one mutex and the two flags its waits watch. The parts of
// the scheduler (membership.h, table_registry.h, job.h, barriers.h,
// durable_state.h, checkpoint_coordinator.h) are not thread-safe
// themselves: the scheduler (scheduler.cc) holds `mu` around every call
// into them, and a part that waits, or releases the lock around blocking
// work, takes this struct as an argument, annotated
// ABSL_EXCLUSIVE_LOCKS_REQUIRED(lock.mu) (or ABSL_LOCKS_EXCLUDED(lock.mu)
// where it locks by itself, from a thread of its own).
//
//   absl::Status AwaitDurable(SchedulerMutex& lock, uint64_t version)
//       ABSL_EXCLUSIVE_LOCKS_REQUIRED(lock.mu);
//
// Every wait under `mu` ends once `stopping` is set (Shutdown), with
// kUnavailable; `stopped` is set when Shutdown has finished.
#ifndef DOWNPOUR_SCHEDULER_SCHEDULER_MUTEX_H_
#define DOWNPOUR_SCHEDULER_SCHEDULER_MUTEX_H_

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace downpour {

struct SchedulerMutex {
  absl::Mutex mu;
  bool stopping ABSL_GUARDED_BY(mu) = false;
  bool stopped ABSL_GUARDED_BY(mu) = false;
};

}  // namespace downpour

#endif  // DOWNPOUR_SCHEDULER_SCHEDULER_MUTEX_H_
