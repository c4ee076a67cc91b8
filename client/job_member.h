// Taking part in a job as a worker: what any training program (ps_worker,
// or a Python program through bindings) needs from the scheduler besides
// the data plane of client/client.h.
//
//   JobMemberOptions o;
//   o.scheduler_address = "127.0.0.1:7070";
//   o.name = "worker-3";  // stable: joining again under it keeps the rank
//   DP_ASSIGN_OR_RETURN(std::unique_ptr<JobMember> member, JobMember::Join(o));
//   const ConsistencyPolicy& policy = member->policy();  // asked, not parsed
//   ... declare tables with TableOptions::follows_job, rank 0 initializes ...
//   DP_RETURN_IF_ERROR(member->Barrier("init", absl::Minutes(2)));
//   for (Clock c = 0; c < steps; ++c) {
//     DP_RETURN_IF_ERROR(member->WaitClock(c, absl::Minutes(2)).status());
//     client->SetWorkerClock(member->rank(), c);
//     ... pull, compute, push, wait for the acknowledgements ...
//     ClockReport report;
//     report.clock = c + 1;
//     report.loss = loss;
//     DP_RETURN_IF_ERROR(member->ReportClock(report));  // does not block
//   }
//   DP_RETURN_IF_ERROR(member->Flush(absl::Seconds(30)));
//
// Joining registers the program as a WORKER: the scheduler gives it a node
// id, a rank in [0, N + b) and the job's consistency policy. From then on
// a background thread heartbeats (a worker silent for the scheduler's
// --dead_after_ms is declared dead), and clock reports go out from another
// thread, in order; a report still queued when a newer one comes is
// replaced by it (clocks only move forward and the newer figures supersede
// the older, except a test accuracy, which is kept). Each reply brings the
// smallest clock of the other workers, so the member knows a lower bound
// on the gating clock and WaitClock asks the scheduler only when that bound
// does not already let the clock proceed.
//
// The policy's guarantees hold only if a worker reports clock c + 1 after
// every push of its iteration c is acknowledged (see consistency.h).
//
// Through a scheduler outage (down, restarting on its --state_dir, or
// restoring the job from a checkpoint) the member keeps going: a clock
// report the scheduler does not answer (kUnavailable, kDeadlineExceeded) is
// sent again until it is, unless a newer one replaced it; WaitClock and
// Barrier retry kUnavailable until their timeout; Join retries until
// register_timeout. A process registers with one incarnation (random, for
// the life of the process): a new process under a name replaces the old
// one at once (which a restarted scheduler may still list as alive), a
// registration retried because its reply was lost keeps what it got, and a
// second live member of one process under a name is refused
// (kAlreadyExists).
//
// A job restored from a checkpoint resumes at its clock, and a replacement
// for a lost worker at its predecessor's: start_clock() is where this member
// starts (0 for a new job), restored_from() the checkpoint.
//
// Errors (absl::Status, canonical codes):
//   kInvalidArgument    no scheduler address; a job config without a known
//                       policy; Join: a requested rank outside the job
//   kUnavailable        the scheduler cannot be reached, or it is shutting
//                       down
//   kDeadlineExceeded   a wait (WaitClock, Barrier, Flush) timed out; Join:
//                       no scheduler answered within register_timeout
//                       (Join retries until then)
//   kAlreadyExists      Join: a live member of this process already has
//                       this name, or a live worker the requested rank.
//                       (A new process joining under a live name takes it
//                       over: the scheduler declares the old one dead, as
//                       a restarted pod must.)
//   kResourceExhausted  Join: the job has all its N + b workers
//   kUnauthenticated    the cluster has a secret and this member lacks it
//   kPermissionDenied   Join: the scheduler has a job token and this member
//                       lacks it
//   kFailedPrecondition a clock report moved the clock back or beyond what
//                       the policy allows, or the job was rolled back to a
//                       checkpoint under it (join again); Join: the name
//                       holds another rank than the one requested, or the
//                       rank was given up (the job went on without it)
//   kAborted            the job failed: a lost worker was not replaced in
//                       time (--on_worker_loss=stop); the message names it
//
// Thread-safe: every method may be called from any thread.
#ifndef DOWNPOUR_CLIENT_JOB_MEMBER_H_
#define DOWNPOUR_CLIENT_JOB_MEMBER_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "common/auth.h"
#include "common/types.h"
#include "consistency/consistency.h"

namespace downpour {

struct JobMemberOptions {
  std::string scheduler_address;  // host:port of ps_scheduler
  // Identity in the job: a member joining again under the name of a dead
  // one gets its node id and rank back. Empty: a fresh identity each time.
  std::string name;
  // The rank to take (e.g. a Kubernetes Indexed Job's completion index), so
  // that a replacement takes its predecessor's rank; granted exactly, from
  // a DEAD holder too. -1: the scheduler picks (the name's old rank, else
  // the smallest free one).
  int rank = -1;
  // The job token, when the scheduler has one (ps_scheduler
  // --job_token_file): without it no rank is granted (kPermissionDenied).
  std::string job_token;
  // The cluster secret, if it has one (common/auth.h).
  ClusterAuth auth;
  // How long Join keeps retrying a scheduler that is not up yet, or that
  // is restoring the job from a checkpoint.
  absl::Duration register_timeout = absl::Seconds(30);
  // Deadline of each short call (heartbeat, clock report).
  absl::Duration rpc_timeout = absl::Seconds(10);
  // Called once, from the heartbeat thread, when the scheduler says the job
  // has failed (kAborted naming a lost worker: --on_worker_loss=stop). A
  // worker blocked on the data plane learns it only this way. Empty: it is
  // only logged (WaitClock, Barrier and ReportClock return it too).
  std::function<void(const absl::Status&)> on_job_failed;
  // Called once, from the heartbeat thread, when the operator asks this
  // worker to leave the job for good (psctl retire, ASP and SSP): finish
  // the step under way, then LeaveForGood. Empty: asked_to_leave() only.
  std::function<void()> on_asked_to_leave;
};

// A worker's progress at the end of an iteration, for the job status.
// A worker's part of an epoch's examples (JobMember::EpochShare): those
// with index % count == index_in_split. Not in the split (index -1, count
// 0): the worker joined after the epoch began and trains none of it.
struct EpochShare {
  int index = -1;
  int count = 0;
  bool trains() const { return index >= 0; }
};

struct ClockReport {
  // Iterations completed: every push of the iterations below it has been
  // acknowledged by the servers.
  Clock clock = 0;
  double loss = 0;            // of the last mini-batch
  uint64_t examples = 0;      // examples processed by this worker in all
  double test_accuracy = -1;  // < 0: not evaluated at this clock
  int64_t max_staleness = 0;  // largest staleness its pulls saw
  uint64_t discarded = 0;     // its pushes the servers dropped as late
};

class JobMember {
 public:
  // Registers with the scheduler and starts heartbeating. Errors above.
  static absl::StatusOr<std::unique_ptr<JobMember>> Join(
      const JobMemberOptions& options);
  // Stops heartbeating; a report still queued is sent first (use Flush to
  // learn its outcome). The scheduler declares the member dead after its
  // --dead_after_ms.
  virtual ~JobMember() = default;

  virtual NodeId node_id() const = 0;
  // Leaves the job at once (the scheduler marks it LEFT, nobody waits for
  // its heartbeats to stop): sends the queued clock report (up to
  // `timeout`), stops heartbeating and tells the scheduler. `finished`: it
  // completed its steps; else its rank waits for a replacement like a lost
  // one's. Later calls to the member fail or go unheard. The scheduler's
  // errors (kNotFound for an unknown node), or the flush's.
  virtual absl::Status Leave(bool finished, const std::string& reason,
                             absl::Duration timeout) = 0;
  // Leaves the job for good, as Leave does, but its rank retires at once
  // (ASP and SSP): it gates nobody from now on and nobody waits for a
  // replacement. kFailedPrecondition under BSP, leaving nothing (the
  // member stays in the job).
  virtual absl::Status LeaveForGood(const std::string& reason,
                                    absl::Duration timeout) = 0;
  // In [0, policy().max_ranks()): below total_workers() for a worker the
  // job started with, beyond for one that took an elastic seat; the same
  // after joining again.
  virtual int rank() const = 0;
  // The job's consistency policy, as the scheduler declared it.
  virtual const ConsistencyPolicy& policy() const = 0;
  // The clock to start from (RegisterReply.start_clock), the rank's clock
  // in the job: 0 for a new job; the checkpoint's clock for a job restored
  // from one; for a replacement of a lost worker, the clock its predecessor
  // had reported (it redoes the iteration that was cut short, on the same
  // data shard).
  virtual Clock start_clock() const = 0;
  // The clock this rank's work began at: 0 for the ranks the job started
  // with, the clock an elastic seat was first taken at for a seat
  // (ClusterMap.seat_clocks). start_clock() - first_clock() iterations of
  // this rank came before this member (a replacement's predecessor's).
  virtual Clock first_clock() const = 0;
  // The checkpoint the job was last restored from; 0: none.
  virtual uint64_t restored_from() const = 0;
  // Whether the job's workers had passed barrier `name` when this member
  // registered: a replacement joining a running job, which must neither
  // wait there alone nor redo what came before it (initial values).
  virtual bool BarrierPassed(absl::string_view name) const = 0;
  // Whether the operator asked this worker to leave the job for good
  // (psctl retire; learnt from the heartbeats): a training program checks
  // it between steps and then calls LeaveForGood.
  virtual bool asked_to_leave() const = 0;

  // Queues `report` and returns at once. Returns the first error an
  // earlier report got (then every later call returns it too).
  virtual absl::Status ReportClock(const ClockReport& report) = 0;
  // Waits until every queued report has been sent; the first error a
  // report got, or kDeadlineExceeded.
  virtual absl::Status Flush(absl::Duration timeout) = 0;
  // The clock last queued by ReportClock (start_clock() before any).
  virtual Clock reported_clock() const = 0;
  // A lower bound on every other worker's clock (it only grows): from the
  // replies to clock reports and from WaitClock.
  virtual Clock others_lower_bound() const = 0;

  // Blocks until the policy lets a worker at `clock` start that iteration,
  // and returns a lower bound on the gating clock (exact when it asked the
  // scheduler). Returns at once under ASP, and without backup workers when
  // min(reported_clock(), others_lower_bound()) already allows `clock`.
  // With backups it always asks: a gating clock above `clock` tells a
  // straggler to skip ahead. kDeadlineExceeded after `timeout`.
  virtual absl::StatusOr<Clock> WaitClock(Clock clock,
                                          absl::Duration timeout) = 0;
  // The same, as the table of id `table` with consistency `consistency`
  // (Table::consistency: "bsp", "ssp:N", "asp"; "" the job's) bounds it:
  // before reading an embedding table of its own policy (the hybrid). Its
  // bound over the job's workers' clocks; kNotFound for a table the
  // scheduler does not know.
  virtual absl::StatusOr<Clock> WaitClockForTable(
      Clock clock, TableId table, const std::string& consistency,
      absl::Duration timeout) = 0;
  // This worker's share of epoch `epoch` (>= 0): the epoch's examples are
  // split over the workers in the job when any of them first asks for it
  // (EpochSplitRequest), so that within an epoch no example is skipped or
  // trained twice while workers join and leave. A worker leaving for good
  // should do so between epochs: the split it is in counts on it. The
  // scheduler's errors.
  virtual absl::StatusOr<EpochShare> EpochShareOf(int64_t epoch,
                                                  absl::Duration timeout) = 0;
  // Blocks until every worker of the job (N + b) has reached the barrier
  // `name`; a barrier can be reused once released. kDeadlineExceeded
  // after `timeout` (this member is then no longer counted as arrived).
  virtual absl::Status Barrier(const std::string& name,
                               absl::Duration timeout) = 0;
};

}  // namespace downpour

#endif  // DOWNPOUR_CLIENT_JOB_MEMBER_H_
