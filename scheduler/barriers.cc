#include "scheduler/barriers.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/logging.h"

namespace downpour {

absl::Status Barriers::Arrive(SchedulerMutex& lock,
                              const proto::BarrierRequest& req,
                              bool job_barrier, absl::Duration timeout,
                              proto::BarrierReply* reply) {
  if (!barriers_.contains(req.name()) &&
      static_cast<int>(barriers_.size()) >= max_open_) {
    return absl::ResourceExhaustedError(
        absl::StrCat("barrier '", req.name(), "': ", barriers_.size(),
                     " barriers are open already"));
  }
  BarrierState& b = barriers_[req.name()];
  const uint64_t generation = b.generation;
  b.arrived.insert(req.node_id());
  auto release = [&](BarrierState& state) {
    state.arrived.clear();
    state.generation++;
    ForgetIfIdle(req.name());  // `state` may be gone from here on
    RecordPassed(req.name());
    reply->set_arrived(req.count());
    return absl::OkStatus();
  };
  if (Complete(b, req, job_barrier)) return release(b);
  ++b.waiters;
  // `b` may move while the lock is released: look it up again.
  auto released = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(lock.mu) {
    const BarrierState& now = barriers_[req.name()];
    return lock.stopping || !job_->failure().ok() ||
           now.generation != generation || Complete(now, req, job_barrier);
  };
  const bool in_time =
      lock.mu.AwaitWithTimeout(absl::Condition(&released), timeout);
  BarrierState& after = barriers_[req.name()];
  --after.waiters;
  if (!lock.stopping && job_->failure().ok() &&
      after.generation == generation && Complete(after, req, job_barrier)) {
    // The ranks still missing were given up while it waited.
    return release(after);
  }
  if (!in_time) {
    after.arrived.erase(req.node_id());
    const size_t arrived = after.arrived.size() + 1;
    ForgetIfIdle(req.name());
    return absl::DeadlineExceededError(
        absl::StrCat("barrier '", req.name(), "': ", arrived, " of ",
                     req.count(), " arrived in time"));
  }
  // Woken without the barrier released: the job failed (or stops).
  const bool released_now = after.generation != generation;
  if (!released_now) after.arrived.erase(req.node_id());
  ForgetIfIdle(req.name());  // `after` may be gone from here on
  if (lock.stopping) return absl::UnavailableError("scheduler shutting down");
  if (!released_now) return job_->failure();
  reply->set_arrived(req.count());
  return absl::OkStatus();
}

bool Barriers::Complete(const BarrierState& state,
                        const proto::BarrierRequest& req,
                        bool job_barrier) const {
  if (!job_barrier) return state.arrived.size() >= req.count();
  // Arrivals of ranks given up since do not count twice.
  int arrived = 0;
  for (NodeId n : state.arrived) {
    const int rank = job_->RankOf(n);
    arrived += rank < 0 || !job_->GivenUp(rank);
  }
  return arrived >=
         std::max<int>(1, static_cast<int>(req.count()) - job_->NotWaitedFor());
}

void Barriers::RecordPassed(const std::string& name) {
  // Bounded: a job has a few start-up barriers, not one per step.
  if (passed_.contains(name)) return;
  if (passed_.size() >= kMaxPassedBarriers) {
    DP_LOG(WARNING) << "barrier '" << name << "' passed; not remembered ("
                    << kMaxPassedBarriers << " are already)";
    return;
  }
  passed_.insert(name);
  durable_->Commit();
}

void Barriers::ForgetIfIdle(const std::string& name) {
  auto it = barriers_.find(name);
  if (it != barriers_.end() && it->second.waiters == 0 &&
      it->second.arrived.empty()) {
    barriers_.erase(it);
  }
}

void Barriers::Export(proto::SchedulerState* state) const {
  for (const std::string& b : passed_) state->add_passed_barriers(b);
}

void Barriers::Import(const proto::SchedulerState& state) {
  for (const std::string& b : state.passed_barriers()) {
    if (passed_.size() < kMaxPassedBarriers) passed_.insert(b);
  }
}

}  // namespace downpour
