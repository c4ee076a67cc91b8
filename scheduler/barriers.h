// Named barriers: arrivals, release, and the barriers the job has passed
// (remembered with the state, so that a replacement worker is told them,
// RegisterReply.passed_barriers, instead of waiting at one for ever).
//
//   Barriers barriers(max_open, &job, &durable);
//   DP_RETURN_IF_ERROR(barriers.Arrive(lock, req, job_barrier, timeout,
//                                      &reply));   // blocks
//
// A barrier releases once req.count() nodes arrived, and can be used again
// (a new generation). A barrier of all the job's workers (JobMember::
// Barrier: a WORKER asking for the job's size) does not wait for ranks the
// job goes on without (Job::GivenUp, Job::NotWaitedFor), which can change
// while it waits.
//
// Thread-compatible: the scheduler's mutex guards it; Arrive takes that
// mutex and releases it while it waits.
#ifndef DOWNPOUR_SCHEDULER_BARRIERS_H_
#define DOWNPOUR_SCHEDULER_BARRIERS_H_

#include <cstdint>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/container/btree_set.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/time/time.h"
#include "common/types.h"
#include "proto/downpour.pb.h"
#include "scheduler/durable_state.h"
#include "scheduler/job.h"
#include "scheduler/scheduler_mutex.h"

namespace downpour {

class Barriers {
 public:
  // At most `max_open` barriers at once. `job` and `durable` are borrowed
  // and must outlive this object.
  Barriers(int max_open, const Job* job, DurableState* durable)
      : max_open_(max_open), job_(job), durable_(durable) {}

  // Node req.node_id() arrives at barrier req.name() and waits up to
  // `timeout` for the others (`job_barrier`: a barrier of the job's
  // workers, see above). kResourceExhausted when max_open barriers are open
  // already, kDeadlineExceeded (the arrival taken back) after `timeout`,
  // the job's failure (kAborted) if it fails meanwhile, kUnavailable if the
  // scheduler stops. REQUIRES: a checked request (CheckBarrierRequest).
  absl::Status Arrive(SchedulerMutex& lock, const proto::BarrierRequest& req,
                      bool job_barrier, absl::Duration timeout,
                      proto::BarrierReply* reply)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(lock.mu);

  // The barriers the job passed (at most 64 are remembered).
  const absl::btree_set<std::string>& passed() const { return passed_; }
  void Export(proto::SchedulerState* state) const;
  void Import(const proto::SchedulerState& state);

 private:
  struct BarrierState {
    uint64_t generation = 0;
    absl::flat_hash_set<NodeId> arrived;
    int waiters = 0;  // calls blocked on it
  };
  static constexpr size_t kMaxPassedBarriers = 64;

  // Whether `state` has its arrivals (see above).
  bool Complete(const BarrierState& state, const proto::BarrierRequest& req,
                bool job_barrier) const;
  // Remembers (on disk with the state) that the job passed barrier `name`.
  void RecordPassed(const std::string& name);
  void ForgetIfIdle(const std::string& name);

  const int max_open_;
  const Job* const job_;
  DurableState* const durable_;
  absl::flat_hash_map<std::string, BarrierState> barriers_;
  absl::btree_set<std::string> passed_;
};

}  // namespace downpour

#endif  // DOWNPOUR_SCHEDULER_BARRIERS_H_
