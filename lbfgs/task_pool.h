// The coordinator's queue of gradient tasks (Sandblaster): one round (an
// objective evaluation) at a time, cut into many small tasks that workers
// take as they free up.
//
// Rules, in the order Next() applies them:
//   1. a task nobody has started yet, lowest id first;
//   2. a task whose every copy has run longer than `lease` (its worker is
//      presumed dead) is handed out again;
//   3. with backups on, once nothing is left to start, an idle worker gets a
//      backup copy of a late task: one running longer than twice the median
//      time of the round's finished tasks (the one started first, at most
//      two copies at once, never to the worker already running it).
// The first result of a task counts; later ones (the other copy, a worker
// that was presumed dead, a result for an older round) are dropped.
//
// Thread-safe.
#ifndef DOWNPOUR_LBFGS_TASK_POOL_H_
#define DOWNPOUR_LBFGS_TASK_POOL_H_

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace downpour {

struct TaskStats {
  uint64_t assigned = 0;    // first copies handed out
  uint64_t backups = 0;     // backup copies handed out
  uint64_t reassigned = 0;  // copies handed out after a lease expired
  uint64_t dropped = 0;     // results not counted (duplicate or late)
};

class TaskPool {
 public:
  struct Assignment {
    enum Kind { kWait, kRun, kDone } kind = kWait;
    int64_t round = 0;
    uint64_t task = 0;
    uint64_t begin = 0, end = 0;
    bool backup = false;
  };

  TaskPool(bool backups, absl::Duration lease)
      : backups_(backups), lease_(lease) {}

  // Opens `round` with tasks over `ranges` (task i = ranges[i]) and blocks
  // until each has a counted result; returns the results in task order.
  // kDeadlineExceeded after `timeout`; kCancelled if Close() is called.
  // REQUIRES: round greater than every earlier round; one caller at a time.
  absl::StatusOr<std::vector<double>> RunRound(
      int64_t round, const std::vector<std::pair<uint64_t, uint64_t>>& ranges,
      absl::Duration timeout) ABSL_LOCKS_EXCLUDED(mu_);

  // The next assignment for `worker`, waiting up to `wait` for one.
  Assignment Next(const std::string& worker, absl::Duration wait)
      ABSL_LOCKS_EXCLUDED(mu_);

  // A result; true if it counted.
  bool Finish(int64_t round, uint64_t task, double result)
      ABSL_LOCKS_EXCLUDED(mu_);

  // Every worker gets kDone from now on.
  void Close() ABSL_LOCKS_EXCLUDED(mu_);
  // The job cannot go on (e.g. a range of its table has no live server):
  // a RunRound waiting now, or called later, returns `why` at once.
  void Abort(const absl::Status& why) ABSL_LOCKS_EXCLUDED(mu_);
  // After Close: waits until every worker that ever asked for a task has
  // been told kDone or has been silent for `silence` (it died), at most
  // `timeout`; so that workers exit cleanly before the service goes away.
  void WaitForWorkersToLeave(absl::Duration silence, absl::Duration timeout)
      ABSL_LOCKS_EXCLUDED(mu_);

  TaskStats stats() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  struct Task {
    uint64_t begin = 0, end = 0;
    std::vector<std::string> runners;  // workers given a copy
    absl::Time last_start = absl::InfinitePast();
    absl::Time first_start = absl::InfinitePast();
    bool done = false;
    double result = 0;
  };
  // False when nothing can be handed out now; *retry_at says when a running
  // task becomes eligible for a copy.
  bool TryAssign(const std::string& worker, Assignment* out,
                 absl::Time* retry_at) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Duration BackupDelay() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const bool backups_;
  const absl::Duration lease_;
  mutable absl::Mutex mu_;
  // Signalled when a round opens, a task finishes or the pool closes.
  absl::CondVar changed_;
  int64_t round_ ABSL_GUARDED_BY(mu_) = 0;
  bool open_ ABSL_GUARDED_BY(mu_) = false;
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status aborted_ ABSL_GUARDED_BY(mu_);
  std::vector<Task> tasks_ ABSL_GUARDED_BY(mu_);
  size_t next_unstarted_ ABSL_GUARDED_BY(mu_) = 0;
  size_t remaining_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<absl::Duration> finished_durations_ ABSL_GUARDED_BY(mu_);
  TaskStats stats_ ABSL_GUARDED_BY(mu_);
  struct WorkerSeen {
    absl::Time last_contact;
    bool told_done = false;
  };
  absl::flat_hash_map<std::string, WorkerSeen> workers_ ABSL_GUARDED_BY(mu_);
};

}  // namespace downpour

#endif  // DOWNPOUR_LBFGS_TASK_POOL_H_
