#include "lbfgs/task_pool.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace downpour {

absl::StatusOr<std::vector<double>> TaskPool::RunRound(
    int64_t round, const std::vector<std::pair<uint64_t, uint64_t>>& ranges,
    absl::Duration timeout) {
  absl::MutexLock lock(&mu_);
  round_ = round;
  tasks_.assign(ranges.size(), Task());
  for (size_t i = 0; i < ranges.size(); ++i) {
    tasks_[i].begin = ranges[i].first;
    tasks_[i].end = ranges[i].second;
  }
  next_unstarted_ = 0;
  remaining_ = ranges.size();
  finished_durations_.clear();
  open_ = true;
  changed_.SignalAll();
  auto finished = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return remaining_ == 0 || closed_ || !aborted_.ok();
  };
  const bool in_time =
      mu_.AwaitWithTimeout(absl::Condition(&finished), timeout);
  open_ = false;
  if (!aborted_.ok()) return aborted_;
  if (closed_) return absl::CancelledError("task pool closed");
  if (!in_time) {
    return absl::DeadlineExceededError(
        absl::StrCat("round ", round, ": ", remaining_, " of ", tasks_.size(),
                     " tasks unfinished after ", absl::FormatDuration(timeout),
                     " (are workers running?)"));
  }
  std::vector<double> results(tasks_.size());
  for (size_t i = 0; i < tasks_.size(); ++i) results[i] = tasks_[i].result;
  return results;
}

absl::Duration TaskPool::BackupDelay() const {
  // Twice the median time of the tasks finished so far in this round: a
  // copy only where it can win, so that a busy machine does not spend its
  // cores on copies of tasks that are on time.
  if (finished_durations_.empty()) return absl::InfiniteDuration();
  std::vector<absl::Duration> d = finished_durations_;
  std::nth_element(d.begin(), d.begin() + d.size() / 2, d.end());
  return 2 * d[d.size() / 2];
}

bool TaskPool::TryAssign(const std::string& worker, Assignment* out,
                         absl::Time* retry_at) {
  *retry_at = absl::InfiniteFuture();
  if (!open_) return false;
  const absl::Time now = absl::Now();
  // Runs under mu_ (held by the caller of TryAssign).
  auto give = [&](size_t i, bool backup) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    Task& t = tasks_[i];
    if (t.runners.empty()) t.first_start = now;
    t.runners.push_back(worker);
    t.last_start = now;
    out->kind = Assignment::kRun;
    out->round = round_;
    out->task = i;
    out->begin = t.begin;
    out->end = t.end;
    out->backup = backup;
  };
  if (next_unstarted_ < tasks_.size()) {
    ++stats_.assigned;
    give(next_unstarted_++, false);
    return true;
  }
  // Every task has started: a copy of one whose worker seems gone, else
  // (backups on) a copy of the late task started first.
  const absl::Duration backup_delay = BackupDelay();
  int best = -1;
  for (size_t i = 0; i < tasks_.size(); ++i) {
    const Task& t = tasks_[i];
    if (t.done) continue;
    if (now - t.last_start > lease_) {
      ++stats_.reassigned;
      give(i, true);
      return true;
    }
    *retry_at = std::min(*retry_at, t.last_start + lease_);
    if (!backups_ || t.runners.size() >= 2 ||
        std::find(t.runners.begin(), t.runners.end(), worker) !=
            t.runners.end()) {
      continue;
    }
    if (now - t.first_start < backup_delay) {
      *retry_at = std::min(*retry_at, t.first_start + backup_delay);
      continue;
    }
    if (best < 0 || t.first_start < tasks_[best].first_start)
      best = static_cast<int>(i);
  }
  if (best < 0) return false;
  ++stats_.backups;
  give(best, true);
  return true;
}

TaskPool::Assignment TaskPool::Next(const std::string& worker,
                                    absl::Duration wait) {
  const absl::Time deadline = absl::Now() + wait;
  absl::MutexLock lock(&mu_);
  WorkerSeen& seen = workers_[worker];
  seen.last_contact = absl::Now();
  Assignment a;
  while (true) {
    if (closed_) {
      seen.told_done = true;
      changed_.SignalAll();
      a.kind = Assignment::kDone;
      return a;
    }
    absl::Time retry_at;
    if (TryAssign(worker, &a, &retry_at)) return a;
    // Wake when something changes, or when a running task becomes late
    // enough for a copy.
    changed_.WaitWithDeadline(&mu_, std::min(deadline, retry_at));
    if (absl::Now() >= deadline) {
      if (TryAssign(worker, &a, &retry_at)) return a;
      if (closed_) continue;  // tell it kDone above
      a.kind = Assignment::kWait;
      return a;
    }
  }
}

bool TaskPool::Finish(int64_t round, uint64_t task, double result) {
  absl::MutexLock lock(&mu_);
  if (!open_ || round != round_ || task >= tasks_.size() || tasks_[task].done) {
    ++stats_.dropped;
    return false;
  }
  tasks_[task].done = true;
  tasks_[task].result = result;
  finished_durations_.push_back(absl::Now() - tasks_[task].first_start);
  --remaining_;
  changed_.SignalAll();
  return true;
}

void TaskPool::Abort(const absl::Status& why) {
  absl::MutexLock lock(&mu_);
  if (aborted_.ok()) aborted_ = why;
  changed_.SignalAll();
}

void TaskPool::Close() {
  absl::MutexLock lock(&mu_);
  closed_ = true;
  changed_.SignalAll();
}

void TaskPool::WaitForWorkersToLeave(absl::Duration silence,
                                     absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  absl::MutexLock lock(&mu_);
  while (absl::Now() < deadline) {
    const absl::Time now = absl::Now();
    bool all_left = true;
    for (const auto& [name, w] : workers_) {
      if (!w.told_done && now - w.last_contact < silence) all_left = false;
    }
    if (all_left) return;
    changed_.WaitWithDeadline(
        &mu_, std::min(deadline, now + absl::Milliseconds(100)));
  }
}

TaskStats TaskPool::stats() const {
  absl::MutexLock lock(&mu_);
  return stats_;
}

}  // namespace downpour
