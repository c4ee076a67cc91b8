// The job the workers run: its configuration, which node holds which rank,
// the workers' clocks and progress (ClockTable), and the rule for lost
// workers (WorkerRoster). The rules themselves live in consistency.h and
// worker_roster.h; this keeps them together and answers the scheduler's
// questions about ranks and clocks.
//
//   Job job(options, &map, &members, &durable);
//   DP_ASSIGN_OR_RETURN(int rank, job.GrantRank(req, node));  // Register
//   DP_RETURN_IF_ERROR(job.TakeOverRank(rank, req.name()));
//   job.Assign(rank, node->id());
//   DP_RETURN_IF_ERROR(job.CheckRankHolder("wait clock", node, rank));
//   job.WorkerGone(node, name, "missed heartbeats", false, now);  // sweep
//   job.ApplyWorkerLossRule(now);                                // sweep
//
// Ranks: a worker asking for a rank gets exactly that one, taken over from
// a holder that is not ALIVE; one that does not ask gets its old rank back
// if its name had one, else the smallest rank nobody holds, else the next
// elastic seat (--elastic_workers): it joins the running job at the gating
// clock (ClockTable::Join; under BSP the step after it) and the map's
// job_workers, seat_clocks and seat_epochs grow, a new epoch. Retiring a rank
// (--on_worker_loss=continue, or a worker leaving for good) adds it to the
// map's retired_ranks, a new epoch.
//
// Thread-compatible: the scheduler's mutex guards it and the map.
#ifndef DOWNPOUR_SCHEDULER_JOB_H_
#define DOWNPOUR_SCHEDULER_JOB_H_

#include <string>
#include <vector>

#include "absl/container/btree_map.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "common/types.h"
#include "consistency/consistency.h"
#include "proto/downpour.pb.h"
#include "scheduler/durable_state.h"
#include "scheduler/membership.h"
#include "scheduler/worker_roster.h"

namespace downpour {

struct JobOptions {
  ConsistencyPolicy policy;
  WorkerLossOptions worker_loss;
  // Clocks tolerated beyond the policy's bound (ClockTable::WithinBound).
  Clock clock_report_slack = 0;
};

class Job {
 public:
  // Borrowed, must outlive this object: `map` (its retired_ranks), the
  // nodes, and the state it commits changes to.
  Job(const JobOptions& options, proto::ClusterMap* map,
      const Membership* members, DurableState* durable);

  const proto::JobConfig& config() const { return config_; }
  const ConsistencyPolicy& policy() const { return options_.policy; }
  // The workers the job starts with: num_workers + backup_workers (a job
  // barrier counts these; elastic seats are beyond).
  int size() const { return options_.policy.total_workers(); }
  // OK while the job runs; kAborted naming the lost worker once it failed.
  const absl::Status& failure() const { return roster_.failure(); }

  // --- Ranks ---
  // The rank a registering worker gets (see above); `node` is the known
  // node of its name and role, if any (never ALIVE here). kInvalidArgument
  // for a rank outside the job, kFailedPrecondition for a name asking for a
  // rank other than its own, kAlreadyExists for a rank an ALIVE worker
  // holds or lost while dead, kResourceExhausted when every rank is held.
  absl::StatusOr<int> GrantRank(const proto::RegisterRequest& req,
                                const proto::NodeInfo* node) const;
  // A worker registering for `rank` (as `name`) replaces whoever held it,
  // or joins the job in that elastic seat: kFailedPrecondition if the job
  // already went on without that rank.
  absl::Status TakeOverRank(int rank, const std::string& name);
  // The worker of node `id` leaves for good (LeaveRequest.retire): its rank
  // retires at once. kFailedPrecondition under BSP; OK for a node holding
  // no rank, or a rank already retired.
  absl::Status LeaveForGood(NodeId id, const std::string& name,
                            const std::string& how);
  // The operator removes `rank` for good (RetireWorkerRequest): a live
  // holder is asked to leave (AskedToLeave, through its heartbeats), any
  // other holder's rank retires at once (the caller commits the state).
  // Errors as RetireWorkerRequest says.
  absl::StatusOr<proto::RetireWorkerReply> Retire(int rank);
  // Whether the worker holding `rank` was asked to leave for good.
  bool AskedToLeave(int rank) const { return asked_to_leave_.contains(rank); }
  // `node` holds `rank` from now on; a previous holder gives it up.
  void Assign(int rank, NodeId node);
  // The rank `node` holds, -1 if none.
  int RankOf(NodeId node) const;
  // A clock call for `rank` from `node`: kInvalidArgument for a rank
  // outside the job, kPermissionDenied unless `node` holds it (a DEAD
  // holder keeps it until another worker takes it over).
  absl::Status CheckRankHolder(absl::string_view what, NodeId node,
                               int rank) const;
  // The worker of node `id` died or left (`how`); unless it `finished`, its
  // rank is lost until a replacement takes it (worker_roster.h).
  void WorkerGone(NodeId id, const std::string& name, const std::string& how,
                  bool finished, absl::Time now);
  // The bound on waiting for replacements, at `now`: ranks given up stop
  // gating the others (continue), or the job fails (stop). Commits a change.
  void ApplyWorkerLossRule(absl::Time now);
  // Ranks the job does not wait for (WorkerRoster::NotWaitedFor), and
  // whether `rank` is one (lost or retired).
  int NotWaitedFor() const { return roster_.NotWaitedFor(); }
  bool GivenUp(int rank) const {
    return roster_.lost(rank) || roster_.retired(rank);
  }
  // The ranks epoch `epoch`'s examples are split over (EpochSplitRequest):
  // fixed on the first call for it, which sets *fixed_now (the caller
  // commits the state before answering).
  absl::StatusOr<std::vector<int>> EpochSplit(int64_t epoch, bool* fixed_now);
  // Node `id` is forgotten: it holds no rank any more.
  void ForgetNode(NodeId id);

  // --- Clocks ---
  Clock clock(int rank) const { return clocks_.clock(rank); }
  // The workers' gating clock (ClockTable::GatingClock), held below a step
  // a BSP job grows at until every live server has applied the map that
  // announced it (ClusterMap.seat_epochs): a server completing that step
  // with the old count would average over the wrong number of workers.
  Clock GatingClock() const;
  bool MayProceed(Clock clock) const;
  // Whether `rank` may report `clock` (with the job's slack). REQUIRES:
  // 0 <= rank < size().
  bool WithinBound(int rank, Clock clock) const {
    return clocks_.WithinBound(rank, clock, options_.clock_report_slack);
  }
  // A report moving a clock forward beyond the bound: it waits for the
  // others' (the caller's grace wait), claiming `clock` meanwhile
  // (ClockTable::Claim).
  bool BeyondBound(int rank, Clock clock) const {
    return clock >= clocks_.clock(rank) && !WithinBound(rank, clock);
  }
  void Claim(int rank, Clock clock) { clocks_.Claim(rank, clock); }
  void Unclaim(int rank, Clock clock) { clocks_.Unclaim(rank, clock); }
  // Records the report (ClockTable::Advance: kFailedPrecondition for a clock
  // moving back or beyond the bound, changing nothing) and its progress
  // figures; fills the reply's gating clock and the others' minimum.
  absl::Status Advance(const proto::AdvanceClockRequest& req,
                       proto::AdvanceClockReply* reply);
  // The workers' clocks and progress as checkpoint `m` recorded them.
  void SetClocks(const proto::CheckpointManifest& m);
  void FillJobStatus(proto::JobStatus* status) const;
  // Every worker's clock and progress (restored_from left for the caller).
  proto::SchedulerClocks ClocksSnapshot() const;

  // --- State ---
  // The ranks and the roster.
  void Export(proto::SchedulerState* state) const;
  // kFailedPrecondition if `state` (in directory `dir`) holds another job.
  absl::Status CheckSameJob(const proto::SchedulerState& state,
                            const std::string& dir) const;
  // Ranks and roster from `state`; clocks from `clocks` if written since
  // the last restore (`restored_from`), else from `restored` (that
  // checkpoint's manifest, if kept).
  void Import(const proto::SchedulerState& state,
              const proto::SchedulerClocks& clocks, uint64_t restored_from,
              const proto::CheckpointManifest* restored);

 private:
  // Retires `rank` (not retired yet): out of the gate, the roster and the
  // staleness figures, in the map's retired_ranks, a new epoch.
  void RetireNow(int rank, const std::string& name, const std::string& how);
  // Under BSP, the last step any worker may start while a live server has
  // not applied the map announcing a seat (ClusterMap.seat_epochs): the
  // step before the seat's start clock (no limit otherwise).
  Clock ResizeHold() const;

  const JobOptions options_;
  proto::ClusterMap* const map_;
  const Membership* const members_;
  DurableState* const durable_;
  proto::JobConfig config_;
  ClockTable clocks_;
  WorkerRoster roster_;
  std::vector<proto::WorkerStatus> workers_;
  // Workers' ranks, both ways; a rank is held by at most one node.
  absl::flat_hash_map<NodeId, int> rank_of_;
  absl::flat_hash_map<int, NodeId> rank_holder_;
  // Ranks whose live worker was asked to leave for good (Retire); not
  // durable: psctl asks again until the rank has retired.
  absl::flat_hash_set<int> asked_to_leave_;
  // EpochSplit's answers, the kEpochSplitsKept newest.
  absl::btree_map<int64_t, std::vector<int>> epoch_splits_;
};

}  // namespace downpour

#endif  // DOWNPOUR_SCHEDULER_JOB_H_
