// When and how the job's checkpoints are taken and restored: the manifests
// kept, the triggers (on demand, every `every_clocks` gating clocks, every
// `every`), retention, and the rollback of the whole job to a checkpoint
// after a range lost its data or on an operator's request. The calls to the
// servers are checkpoints.h's; this decides, keeps the record and changes
// the map, the tables and the clocks for a restore.
//
//   CheckpointCoordinator checkpoints(options, &map, &members, &tables,
//                                     &job, &durable);
//   thread: { absl::MutexLock l(&lock.mu); checkpoints.Run(lock); }
//   DP_ASSIGN_OR_RETURN(auto m, checkpoints.Checkpoint(lock, timeout, {}));
//
// A restore (docs/ARCHITECTURE.md, "Restore"): every server the manifest
// names must be registered; the map's tables become the checkpoint's, its
// ranges lost until their servers loaded them (in parallel, without the
// lock); then the ranges are served again, the workers' clocks set to the
// checkpoint's and the workers still running must register again
// (RolledBack). A failed restore tries the next older checkpoint. The
// restore under way is part of the state on disk: a restarted scheduler
// finishes it.
//
// Thread-compatible: the scheduler's mutex guards it (and the parts it is
// given); Run, Checkpoint and Restore take that mutex and release it while
// they wait or the servers work.
#ifndef DOWNPOUR_SCHEDULER_CHECKPOINT_COORDINATOR_H_
#define DOWNPOUR_SCHEDULER_CHECKPOINT_COORDINATOR_H_

#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/auth.h"
#include "common/types.h"
#include "proto/downpour.pb.h"
#include "scheduler/checkpoints.h"
#include "scheduler/durable_state.h"
#include "scheduler/job.h"
#include "scheduler/membership.h"
#include "scheduler/scheduler_mutex.h"
#include "scheduler/table_registry.h"

namespace downpour {

struct CheckpointOptions {
  // Triggers (0: off).
  int64_t every_clocks = 0;
  absl::Duration every = absl::ZeroDuration();
  // How long a checkpoint may take (a BSP cut waits for a step to end).
  absl::Duration timeout = absl::Seconds(60);
  int keep = 2;
  // How long a restore waits for its servers before logging them again.
  absl::Duration restore_wait = absl::Seconds(30);
  // BSP: cut synced tables at one clock (CheckpointPlan.bsp).
  bool bsp = false;
  ClusterAuth auth;  // for the servers' admin services
};

class CheckpointCoordinator {
 public:
  // Borrowed, must outlive this object: the map, the parts a restore
  // changes, and the state (its store holds the manifests).
  CheckpointCoordinator(const CheckpointOptions& options,
                        proto::ClusterMap* map, const Membership* members,
                        TableRegistry* tables, Job* job, DurableState* durable);

  // The durability loop: runs the restore under way, and the checkpoints
  // asked for or due, until lock.stopping; then answers the requests left
  // with kUnavailable. Called with the lock held, on a thread of the
  // scheduler's. REQUIRES: a store.
  void Run(SchedulerMutex& lock) ABSL_EXCLUSIVE_LOCKS_REQUIRED(lock.mu);

  // Takes a checkpoint now (with `lbfgs`, a coordinator's state, if not
  // empty) and waits until it is complete or failed (its error).
  // kFailedPrecondition without a store; kDeadlineExceeded after `timeout`
  // (it goes on); kUnavailable once the scheduler stopped.
  absl::StatusOr<proto::CheckpointManifest> Checkpoint(
      SchedulerMutex& lock, absl::Duration timeout,
      const proto::LbfgsState& lbfgs) ABSL_EXCLUSIVE_LOCKS_REQUIRED(lock.mu);

  // The operator's rollback to checkpoint `id`: starts it and waits up to
  // `timeout`. kFailedPrecondition without a store or while another
  // restore runs; kNotFound for a checkpoint not kept; kDeadlineExceeded
  // (it goes on); kAborted if it failed (an older one may have been
  // restored instead); kUnavailable if the scheduler stops.
  absl::StatusOr<proto::CheckpointManifest> Restore(SchedulerMutex& lock,
                                                    uint64_t id,
                                                    absl::Duration timeout)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(lock.mu);

  // `server` came back without the data of ranges only it held: the job
  // rolls back to the newest checkpoint, if there is one and no restore
  // runs.
  void DataLost(const proto::NodeInfo& server);
  // Why a worker may not register now ("" if it may): during a restore,
  // and right after a restart with checkpoints until every server has been
  // heard from (one that lost its data starts a restore, which moves the
  // clocks a worker starts from).
  std::string WorkersHeldBack() const;

  // The checkpoint being restored (0: none).
  uint64_t restoring() const { return restoring_; }
  // The checkpoint last restored (0: none), and its clock.
  uint64_t restored_from() const { return restored_from_; }
  int64_t restored_clock() const { return restored_clock_; }
  // Complete checkpoints, oldest first; nullptr if `id` is not kept.
  const std::vector<proto::CheckpointManifest>& manifests() const {
    return manifests_;
  }
  const proto::CheckpointManifest* FindManifest(uint64_t id) const;

  // Workers running since before the last restore must register again.
  bool RolledBack(NodeId node) const { return rolled_back_.contains(node); }
  // `node` registered (again) or was forgotten.
  void ClearRolledBack(NodeId node) { rolled_back_.erase(node); }

  void Export(proto::SchedulerState* state) const;
  void Import(const proto::SchedulerState& state,
              std::vector<proto::CheckpointManifest> manifests);

 private:
  struct Waiter {
    proto::LbfgsState lbfgs;  // the caller's, if a coordinator
    bool done = false;
    absl::StatusOr<proto::CheckpointManifest> result =
        absl::UnknownError("not run");
  };

  std::vector<CheckpointServer> LiveServers() const;
  // One checkpoint, retried (with a new id) while a part passed the cut
  // clock. Releases the lock while the servers work.
  absl::StatusOr<proto::CheckpointManifest> TakeCheckpoint(
      SchedulerMutex& lock, const proto::LbfgsState& lbfgs)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(lock.mu);
  // Rolls the job back to checkpoint restoring_. Returns with the restore
  // done, failed (then an older checkpoint is tried, or the ranges stay
  // lost), or the scheduler stopping.
  void RunRestore(SchedulerMutex& lock) ABSL_EXCLUSIVE_LOCKS_REQUIRED(lock.mu);
  // Has server `name` load its ranges of `m`, retrying while it is down or
  // behind on the map; its incarnation when it did.
  absl::Status RestoreServer(SchedulerMutex& lock,
                             const proto::CheckpointManifest& m,
                             const std::string& name, uint64_t* incarnation)
      ABSL_LOCKS_EXCLUDED(lock.mu);

  const CheckpointOptions options_;
  proto::ClusterMap* const map_;
  const Membership* const members_;
  TableRegistry* const tables_;
  Job* const job_;
  DurableState* const durable_;
  AdminClients admins_;  // thread-safe itself

  std::vector<proto::CheckpointManifest> manifests_;
  std::deque<std::shared_ptr<Waiter>> requests_;
  uint64_t next_checkpoint_id_ = 1;
  int64_t last_checkpoint_clock_ = 0;
  // The checkpoint being restored (0: none) and the epoch of its map.
  uint64_t restoring_ = 0;
  uint64_t restores_completed_ = 0;  // by this process
  Epoch restore_epoch_ = 0;
  uint64_t restored_from_ = 0;
  int64_t restored_clock_ = 0;
  // Workers not registered since the last restore.
  absl::flat_hash_set<NodeId> rolled_back_;
};

}  // namespace downpour

#endif  // DOWNPOUR_SCHEDULER_CHECKPOINT_COORDINATOR_H_
