// The consistency contract between workers: clocks and bounded staleness.
//
// Each worker has a clock: the number of iterations it has completed. A
// worker completes iteration c by pushing its updates, waiting for their
// acknowledgements, and only then advancing its clock to c + 1. So every
// update of iterations below a worker's clock is applied on the servers.
//
// A policy decides when a worker whose clock is c may start iteration c
// (pull parameters and compute):
//   BSP       staleness 0: once every worker has completed iteration c - 1,
//             so the pull sees all updates of the previous iteration.
//   SSP(s)    while c - min_clock <= s: the pull includes every update of
//             iterations below c - s.
//   ASP       never waits (Downpour / Hogwild).
// With backup workers (N + b workers, b > 0) only the N fastest count: the
// gating clock is the N-th largest clock instead of the minimum, and a
// worker that falls behind it skips ahead.
// Elastic seats (E): ranks [N + b, N + b + E) are vacant at the start and
// gate nobody; a worker joining the running job takes the next one and
// counts in the gate from then on. Under ASP and SSP it starts at the
// gating clock, and a worker may also leave for good (its rank retires).
// Under BSP (without backups) it starts one step beyond the gating clock:
// the step the job grows at, which the cluster map announces (the seat's
// start clock) so that every server counts its push from exactly that
// step on; BSP does not shrink.

// ConsistencyPolicy is the one place that decides policy questions: the
// scheduler builds it from its flags (Parse) and sends it to every worker
// in the job's config (ToJob); a worker reads it back once (FromJob) and
// asks it, never comparing names or recomputing bounds itself. It also
// says how a table that follows the job enforces it on the servers
// (sync_workers, tracked_workers), which the scheduler fills in.
//
// ConsistencyPolicy is a plain value; ClockTable is thread-compatible (the
// scheduler guards it with its mutex).
#ifndef DOWNPOUR_CONSISTENCY_CONSISTENCY_H_
#define DOWNPOUR_CONSISTENCY_CONSISTENCY_H_

#include <cstdint>
#include <limits>
#include <set>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace downpour {
namespace proto {
class JobConfig;  // proto/downpour.proto
class TableSpec;
}  // namespace proto

using Clock = int64_t;

struct ConsistencyPolicy {
  enum class Kind { kBsp, kSsp, kAsp };
  Kind kind = Kind::kBsp;
  Clock staleness = 0;      // SSP's bound s (0 for BSP)
  int num_workers = 1;      // N: workers whose updates count each step
  int backup_workers = 0;   // b: extra workers; the slowest b are ignored
  int elastic_workers = 0;  // E: seats for workers joining a running job

  // "bsp", "ssp" (with `staleness`), "asp". kInvalidArgument otherwise, or
  // for a negative staleness, fewer than 1 worker, negative seats, or
  // seats under BSP with backup workers.
  static absl::StatusOr<ConsistencyPolicy> Parse(const std::string& name,
                                                 Clock staleness,
                                                 int num_workers,
                                                 int backup_workers,
                                                 int elastic_workers = 0);
  // The policy a job config carries (RegisterReply.job). kInvalidArgument
  // for an unspecified or unknown kind, a negative staleness, or fewer than
  // one worker.
  static absl::StatusOr<ConsistencyPolicy> FromJob(const proto::JobConfig& job);
  // Writes this policy into `job` (the inverse of FromJob).
  void ToJob(proto::JobConfig* job) const;
  // "BSP with 4 workers", "SSP(s=3) with 2 workers + 1 backup".
  std::string ToString() const;
  // The policy a table of this job enforces: its own (TableSpec
  // .consistency and .staleness, for a table that follows the job and
  // declares one: the hybrid of dense layers under BSP and embeddings
  // under ASP or SSP), over this job's workers; else this one. The one
  // reading of those fields: the scheduler fills a table's sync_workers
  // and num_workers, and bounds WaitClock for the table, with it.
  ConsistencyPolicy ForTable(const proto::TableSpec& spec) const;

  bool is_bsp() const { return kind == Kind::kBsp; }
  bool is_asp() const { return kind == Kind::kAsp; }
  // The workers the job starts with, backups included: ranks [0, N + b).
  int total_workers() const { return num_workers + backup_workers; }
  // Every rank a worker may hold, elastic seats included: [0, N + b + E).
  int max_ranks() const { return total_workers() + elastic_workers; }
  // Whether a worker at `clock` may start that iteration when the gating
  // clock is `gating` (or any lower bound on it: the gate only opens as
  // the gating clock grows). Always true under ASP.
  bool Allows(Clock clock, Clock gating) const {
    return kind == Kind::kAsp || clock - gating <= bound();
  }
  // How a table that follows the job (TableSpec.follows_job) enforces it on
  // the servers: pushes are held and averaged over this many workers per
  // clock (N under BSP; 0, applied on arrival, otherwise) ...
  uint32_t sync_workers() const {
    return is_bsp() ? static_cast<uint32_t>(num_workers) : 0;
  }
  // ... and the servers track the clocks of every rank (N + b + E) to
  // measure the staleness of pulls (ClusterMap.job_workers says how many
  // have joined).
  uint32_t tracked_workers() const {
    return static_cast<uint32_t>(max_ranks());
  }

  // The bound on (clock - gating clock) for a worker to proceed; "infinite"
  // for ASP.
  Clock bound() const {
    switch (kind) {
      case Kind::kBsp:
        return 0;
      case Kind::kSsp:
        return staleness;
      case Kind::kAsp:
        return std::numeric_limits<Clock>::max();
    }
    return 0;
  }
};

class ClockTable {
 public:
  explicit ClockTable(const ConsistencyPolicy& policy);

  const ConsistencyPolicy& policy() const { return policy_; }
  // Every rank, vacant seats included (policy().max_ranks()).
  int size() const { return static_cast<int>(clocks_.size()); }

  // Records that worker `rank` completed iterations below `clock`. Clocks
  // only move forward, and no further than the policy lets a worker run:
  // kInvalidArgument for a rank outside [0, N + b); kFailedPrecondition
  // (changing nothing) for a clock below the recorded one, or one that
  // WithinBound refuses.
  // `slack`: extra clocks tolerated beyond the bound (see WithinBound).
  absl::Status Advance(int rank, Clock clock, Clock slack = 0);
  // Whether `rank` may report `clock` now: under BSP and SSP(s) no worker
  // may be more than bound() + 1 ahead of the gating clock, taken with
  // `rank` already at `clock` (a worker that completed iteration c - 1 was
  // allowed to start it, so c - 1 - gating <= bound). The slowest worker
  // may always catch up; a clock refused now may be allowed once the
  // others report theirs (their reports travel separately and may lag).
  // Always true under ASP. REQUIRES: 0 <= rank < size().
  // `slack` (>= 0, small beside 2^62) widens the bound: reports of the
  // others travel separately and are coalesced, so what the table records
  // of them may lag the truth by several clocks.
  // The others count at the larger of their recorded clock and their
  // claims (below).
  bool WithinBound(int rank, Clock clock, Clock slack = 0) const;
  // A report of `clock` by `rank` waiting for the others' (the scheduler's
  // grace wait): while it waits, the others' WithinBound counts `rank` as
  // at least there. Workers report asynchronously and coalesce their
  // reports, so two of them may each report a clock beyond what the table
  // records of the other; each claim then admits the other's report,
  // instead of both waiting out the grace and being refused. A claim moves
  // nothing else (GatingClock, MayProceed), and a false one can only admit
  // reports, never refuse one. Pair each Claim with an Unclaim (an Unclaim
  // without its Claim is ignored). Ranks outside [0, N + b) are ignored.
  void Claim(int rank, Clock clock);
  void Unclaim(int rank, Clock clock);
  // Sets worker `rank`'s clock as recorded earlier (a checkpoint, the
  // scheduler's state dir), without Advance's checks: the clocks of a
  // recorded cut satisfy the bound together, not one at a time.
  // kInvalidArgument for a rank outside [0, N + b) or a negative clock.
  absl::Status Restore(int rank, Clock clock);
  Clock clock(int rank) const { return clocks_[rank]; }

  // Stops counting worker `rank` (a lost worker the job goes on without, or
  // one that left for good): the gate is then taken over the others only.
  // Idempotent; ranks outside [0, size()) are ignored.
  void Retire(int rank);
  bool retired(int rank) const { return retired_[rank]; }

  // Elastic seats: ranks from joined() on are vacant (they gate nobody).
  // Join takes the next one for a worker joining the running job: its clock
  // starts at the gating clock (under BSP one beyond, the step the job
  // grows at), so that it holds nobody back, and it counts in the gate
  // from then on. Returns the new rank, or kResourceExhausted when no seat
  // is left.
  absl::StatusOr<int> Join();
  int joined() const { return joined_; }
  // Restores the number of ranks joined (a checkpoint, the scheduler's
  // state dir): at least N + b, at most size().
  void SetJoined(int joined);
  // Whether `rank` gates the others: joined and not retired.
  bool counted(int rank) const { return rank < joined_ && !retired_[rank]; }

  // The clock that gates progress, over the workers not retired: their
  // minimum without backups, else the N-th largest of their clocks (their
  // minimum when fewer than N are left). With every worker retired, the
  // largest clock.
  Clock GatingClock() const;
  // Whether a worker at `clock` may start that iteration now.
  bool MayProceed(Clock clock) const;

 private:
  // The gating clock of `clocks`, and of this table with `rank` at `clock`.
  Clock Gating(std::vector<Clock> clocks) const;
  Clock GatingWith(int rank, Clock clock) const;

  ConsistencyPolicy policy_;
  std::vector<Clock> clocks_;
  std::vector<bool> retired_;
  std::vector<std::multiset<Clock>> claims_;  // by rank
  int joined_;  // ranks [0, joined_) have joined the job
};

// Server-side bookkeeping of which iterations of each worker a table has
// applied, to measure the staleness of a pull: for a pull by a worker at
// clock c, the oldest missing update is the smallest count of applied
// iterations over all workers, and staleness = c - that count (0 when all
// iterations below c are in). Under SSP(s) it never exceeds s.
//
// With backup workers only the `counted` fastest workers gate progress, so
// the oldest missing update is taken over them (the counted-th largest
// applied count) rather than over every worker.
class StalenessTracker {
 public:
  explicit StalenessTracker(int num_workers, int counted = 0)
      : applied_(num_workers, 0),
        retired_(num_workers, false),
        counted_(counted > 0 && counted < num_workers ? counted : num_workers),
        joined_(num_workers) {}
  // An update of iteration `clock` from `rank` was applied. Iterations of
  // one worker are applied in order, so this records clock + 1 completed.
  void Applied(int rank, Clock clock);
  // For a pull at `clock`; also folded into max_observed().
  Clock Observe(Clock clock);
  Clock max_observed() const { return max_observed_; }
  // Per rank, the iterations applied (Applied's clock + 1, 0 for none).
  const std::vector<Clock>& applied() const { return applied_; }
  // The job went on without `rank`: its frozen count no longer makes
  // every later pull look stale.
  void Retire(int rank);
  // Ranks from `joined` on are vacant elastic seats (ClusterMap.job_workers)
  // and are left out too; 0 or more than the tracked ranks: all count.
  // `seat_starts`: the clocks the taken seats started from, the last
  // seat_starts.size() ranks below `joined` (ClusterMap.seat_clocks): their
  // iterations below it count as applied.
  void SetJoined(int joined, const std::vector<Clock>& seat_starts = {});

 private:
  std::vector<Clock> applied_;
  std::vector<bool> retired_;
  std::vector<Clock> scratch_;
  const int counted_;
  int joined_;
  Clock max_observed_ = 0;
};

}  // namespace downpour

#endif  // DOWNPOUR_CONSISTENCY_CONSISTENCY_H_
