// What a node's arrival, departure and death mean for every part of the
// scheduler: membership decides who is there, and this applies it to the
// ranks (job.h), the ranges (table_registry.h), a restore (a server back
// without its data, checkpoint_coordinator.h) and the map's epoch. It is
// the one place where those parts meet, so that they need not know each
// other.
//
//   NodeLifecycle lifecycle(heartbeat_interval, &map, &members, &job,
//                           &barriers, &tables, &checkpoints, &durable);
//   DP_RETURN_IF_ERROR(lifecycle.Register(lock, req, &reply));  // blocks
//   lifecycle.Sweep(absl::Now());   // every sweep slice
//
// Thread-compatible: the scheduler's mutex guards it and the parts it is
// given; Register and Leave take that mutex and release it while they wait
// for the state to be durable.
#ifndef DOWNPOUR_SCHEDULER_NODE_LIFECYCLE_H_
#define DOWNPOUR_SCHEDULER_NODE_LIFECYCLE_H_

#include <cstdint>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/time/time.h"
#include "proto/downpour.pb.h"
#include "scheduler/barriers.h"
#include "scheduler/checkpoint_coordinator.h"
#include "scheduler/durable_state.h"
#include "scheduler/job.h"
#include "scheduler/membership.h"
#include "scheduler/scheduler_mutex.h"
#include "scheduler/table_registry.h"

namespace downpour {

class NodeLifecycle {
 public:
  // `heartbeat_interval` is told to registering nodes. The rest is
  // borrowed and must outlive this object.
  NodeLifecycle(absl::Duration heartbeat_interval, proto::ClusterMap* map,
                Membership* members, Job* job, const Barriers* barriers,
                TableRegistry* tables, CheckpointCoordinator* checkpoints,
                DurableState* durable)
      : heartbeat_interval_(heartbeat_interval),
        map_(map),
        members_(members),
        job_(job),
        barriers_(barriers),
        tables_(tables),
        checkpoints_(checkpoints),
        durable_(durable) {}

  // Registers `req` (checked: CheckRegisterRequest, the job token) and
  // fills the reply once the change is durable. The same name and role
  // gets its old id (a new process fails the old one over); a worker gets
  // its rank (Job::GrantRank); a server back as a new process loses the
  // ranges only it held (and the job may roll back to a checkpoint).
  // kUnavailable for a worker during a restore or before a restarted
  // scheduler heard from its servers, or when the state cannot be
  // written; kAlreadyExists for a name that is ALIVE; kResourceExhausted
  // (the map's caps); the rank's errors.
  absl::Status Register(SchedulerMutex& lock, const proto::RegisterRequest& req,
                        proto::RegisterReply* reply)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(lock.mu);

  // Worker `req.node_id()` leaves: its rank is lost unless it finished, or
  // retires with req.retire() (Job::LeaveForGood: kFailedPrecondition under
  // BSP, and the worker stays ALIVE); a
  // server leaves once it holds no range (drained): LEFT, not a failure. A
  // new epoch, durable before it returns. kNotFound for an unknown node,
  // kInvalidArgument for a client, kFailedPrecondition for a server still
  // holding ranges; OK for a node not ALIVE.
  absl::Status Leave(SchedulerMutex& lock, const proto::LeaveRequest& req)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(lock.mu);

  // Drains a server or calls its drain off (TableRegistry::Drain); durable
  // before it returns. kUnavailable while a restore runs.
  absl::Status Drain(SchedulerMutex& lock, const proto::DrainRequest& req,
                     proto::DrainReply* reply)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(lock.mu);

  // One round of the failure sweep at `now`: the lost-worker rule; the
  // nodes membership declares dead leave their ranges and ranks; those it
  // forgets leave every part; slow handovers are cancelled. One new epoch
  // if anything changed.
  void Sweep(absl::Time now);

 private:
  absl::Status ServerLeaves(SchedulerMutex& lock, proto::NodeInfo* node,
                            const proto::LeaveRequest& req)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(lock.mu);
  // Fills a registration's reply once version `version` of the state is
  // durable (the node's id must survive a restart of the scheduler).
  absl::Status FinishRegister(SchedulerMutex& lock, const proto::NodeInfo& node,
                              int rank, uint64_t version,
                              proto::RegisterReply* reply)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(lock.mu);

  const absl::Duration heartbeat_interval_;
  proto::ClusterMap* const map_;
  Membership* const members_;
  Job* const job_;
  const Barriers* const barriers_;
  TableRegistry* const tables_;
  CheckpointCoordinator* const checkpoints_;
  DurableState* const durable_;
};

}  // namespace downpour

#endif  // DOWNPOUR_SCHEDULER_NODE_LIFECYCLE_H_
