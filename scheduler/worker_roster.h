// What the job does about workers it has lost: the scheduler's rule for a
// worker that died (missed heartbeats) or left (Leave) before finishing.
//
//   WorkerRoster roster(policy, loss_options);
//   roster.Lost(1, "w1", "missed heartbeats", now);   // sweep or Leave
//   ... a replacement registers for rank 1 ...
//   roster.Replaced(1);                              // the job goes on
//   ... or, swept regularly:
//   for (int rank : roster.Check(now)) clocks.Retire(rank);  // continue
//   if (!roster.failure().ok()) ... answer ABORTED with it ...  // stop
//
// The rule: up to b lost ranks (the job's backup workers) are absorbed: the
// N fastest keep going and nothing is waited for. Beyond that the job waits
// up to `replace_timeout` for a replacement (a worker registering under the
// lost one's name or rank takes its rank, data shard and clock). A rank
// still lost after that is handled by `on_loss`: kStop fails the job with
// kAborted naming the worker; kContinue retires the rank (it no longer
// gates the others, and under BSP the servers complete each step with the
// ranks left, ClusterMap.retired_ranks). A retired rank cannot be taken
// again.
//
// Thread-compatible: the scheduler guards it with its mutex.
#ifndef DOWNPOUR_SCHEDULER_WORKER_ROSTER_H_
#define DOWNPOUR_SCHEDULER_WORKER_ROSTER_H_

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "consistency/consistency.h"
#include "proto/downpour.pb.h"

namespace downpour {

struct WorkerLossOptions {
  enum class OnLoss { kStop, kContinue };
  // How long a lost worker (beyond the backups) is waited for.
  absl::Duration replace_timeout = absl::Seconds(60);
  OnLoss on_loss = OnLoss::kStop;

  // "stop" or "continue"; kInvalidArgument otherwise.
  static absl::StatusOr<OnLoss> ParseOnLoss(const std::string& name);
};

class WorkerRoster {
 public:
  WorkerRoster(const ConsistencyPolicy& policy, const WorkerLossOptions& o);

  // The worker holding `rank` (named `name`) is gone: `how` says why, for
  // the messages. Ignored for a rank that finished, is already lost or is
  // retired, and for a rank outside the job.
  void Lost(int rank, const std::string& name, const std::string& how,
            absl::Time now);
  // The worker of `rank` completed its steps: its end is no loss.
  void Finished(int rank);
  // A replacement took `rank`: kFailedPrecondition if the rank was retired
  // (the job went on without it), else OK and the rank is no longer lost.
  absl::Status Replaced(int rank);
  // The worker of `rank` (named `name`) left the job for good (`how`): the
  // rank retires at once, without waiting for a replacement. Ignored for a
  // rank outside the job.
  void Retire(int rank, const std::string& name, const std::string& how);

  // Applies the rule at `now`: returns the ranks to retire (continue), or
  // sets failure() (stop). Call it regularly (the liveness sweep).
  std::vector<int> Check(absl::Time now);

  // The roster as plain data, for the scheduler's state on disk, and
  // back: Import replaces the whole roster (ranks outside the job are
  // ignored), so that a restarted scheduler waits for a replacement only
  // for what is left of the bound.
  proto::WorkerRosterState Export() const;
  void Import(const proto::WorkerRosterState& state);

  // OK while the job runs; kAborted naming the lost worker once it failed.
  const absl::Status& failure() const { return failure_; }
  bool lost(int rank) const { return state_[rank].lost; }
  bool retired(int rank) const { return state_[rank].retired; }
  // Ranks the job does not wait for: the retired ones, and the lost ones
  // while the backup workers absorb them.
  int NotWaitedFor() const;
  bool finished(int rank) const { return state_[rank].finished; }

 private:
  struct RankState {
    bool lost = false;
    bool retired = false;
    bool finished = false;
    std::string name, how;
    absl::Time since;
  };
  bool Valid(int rank) const {
    return rank >= 0 && rank < static_cast<int>(state_.size());
  }

  const ConsistencyPolicy policy_;
  const WorkerLossOptions options_;
  std::vector<RankState> state_;
  absl::Status failure_;
};

}  // namespace downpour

#endif  // DOWNPOUR_SCHEDULER_WORKER_ROSTER_H_
