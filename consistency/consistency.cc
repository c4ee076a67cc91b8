#include "consistency/consistency.h"

#include <algorithm>
#include <limits>

#include "absl/strings/str_cat.h"
#include "proto/downpour.pb.h"

namespace downpour {
namespace {

// The checks every way of building a policy shares.
absl::Status CheckCounts(Clock staleness, int num_workers, int backup_workers) {
  if (staleness < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("SSP staleness must be >= 0, got ", staleness));
  }
  if (num_workers < 1 || backup_workers < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("need at least 1 worker and no negative backups, got ",
                     num_workers, " + ", backup_workers));
  }
  // Each count at most a quarter of INT_MAX, so that their sum with the
  // seats (max_ranks) cannot overflow.
  if (num_workers > std::numeric_limits<int>::max() / 4 ||
      backup_workers > std::numeric_limits<int>::max() / 4) {
    return absl::InvalidArgumentError(
        absl::StrCat("too many workers: ", num_workers, " + ", backup_workers));
  }
  return absl::OkStatus();
}

// Elastic seats: under BSP only without backup workers (see consistency.h).
absl::Status CheckSeats(ConsistencyPolicy::Kind kind, int64_t seats,
                        int backups) {
  if (seats < 0 || seats > std::numeric_limits<int>::max() / 4) {
    return absl::InvalidArgumentError(
        absl::StrCat("elastic workers must be in [0, ",
                     std::numeric_limits<int>::max() / 4, "], got ", seats));
  }
  if (seats > 0 && kind == ConsistencyPolicy::Kind::kBsp && backups > 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "elastic workers (", seats,
        ") under BSP need a job without backup "
        "workers (got ",
        backups,
        "): a BSP job grows by counting every "
        "worker in each step from the step it grows at, which backups, "
        "whose pushes may be left out, do not fit"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<ConsistencyPolicy> ConsistencyPolicy::Parse(
    const std::string& name, Clock staleness, int num_workers,
    int backup_workers, int elastic_workers) {
  ConsistencyPolicy p;
  if (name == "bsp") {
    p.kind = Kind::kBsp;
  } else if (name == "ssp") {
    p.kind = Kind::kSsp;
    p.staleness = staleness;
  } else if (name == "asp") {
    p.kind = Kind::kAsp;
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat("unknown consistency '", name, "' (bsp, ssp, asp)"));
  }
  const absl::Status counts =
      CheckCounts(p.staleness, num_workers, backup_workers);
  if (!counts.ok()) return counts;
  const absl::Status seats =
      CheckSeats(p.kind, elastic_workers, backup_workers);
  if (!seats.ok()) return seats;
  p.num_workers = num_workers;
  p.backup_workers = backup_workers;
  p.elastic_workers = elastic_workers;
  return p;
}

absl::StatusOr<ConsistencyPolicy> ConsistencyPolicy::FromJob(
    const proto::JobConfig& job) {
  ConsistencyPolicy p;
  switch (job.consistency()) {
    case proto::BSP:
      p.kind = Kind::kBsp;
      break;
    case proto::SSP:
      p.kind = Kind::kSsp;
      p.staleness = job.staleness();
      break;
    case proto::ASP:
      p.kind = Kind::kAsp;
      break;
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("job config without a known consistency policy (",
                       proto::Consistency_Name(job.consistency()), " = ",
                       static_cast<int>(job.consistency()), ")"));
  }
  // The wire's counts are unsigned; a value above INT_MAX is rejected, not
  // wrapped.
  // Checked before the cast (CheckCounts and CheckSeats bound them again).
  const uint64_t n = job.num_workers(), b = job.backup_workers(),
                 e = job.elastic_workers();
  constexpr uint64_t kMax = std::numeric_limits<int>::max() / 4;
  if (n > kMax || b > kMax || e > kMax) {
    return absl::InvalidArgumentError(absl::StrCat(
        "job config with ", n, " + ", b, " workers and ", e, " elastic seats"));
  }
  const absl::Status counts =
      CheckCounts(p.staleness, static_cast<int>(n), static_cast<int>(b));
  if (!counts.ok()) return counts;
  const absl::Status seats =
      CheckSeats(p.kind, static_cast<int64_t>(e), static_cast<int>(b));
  if (!seats.ok()) return seats;
  p.num_workers = static_cast<int>(n);
  p.backup_workers = static_cast<int>(b);
  p.elastic_workers = static_cast<int>(e);
  return p;
}

void ConsistencyPolicy::ToJob(proto::JobConfig* job) const {
  job->set_consistency(kind == Kind::kBsp   ? proto::BSP
                       : kind == Kind::kSsp ? proto::SSP
                                            : proto::ASP);
  job->set_staleness(kind == Kind::kSsp ? staleness : 0);
  job->set_num_workers(static_cast<uint32_t>(num_workers));
  job->set_backup_workers(static_cast<uint32_t>(backup_workers));
  job->set_elastic_workers(static_cast<uint32_t>(elastic_workers));
}

ConsistencyPolicy ConsistencyPolicy::ForTable(
    const proto::TableSpec& spec) const {
  if (!spec.follows_job()) return *this;
  ConsistencyPolicy p = *this;
  switch (spec.consistency()) {
    case proto::BSP:
      p.kind = Kind::kBsp;
      p.staleness = 0;
      break;
    case proto::SSP:
      p.kind = Kind::kSsp;
      p.staleness = spec.staleness();
      break;
    case proto::ASP:
      p.kind = Kind::kAsp;
      p.staleness = 0;
      break;
    default:
      break;  // the job's
  }
  return p;
}

std::string ConsistencyPolicy::ToString() const {
  std::string s = kind == Kind::kBsp   ? "BSP"
                  : kind == Kind::kSsp ? absl::StrCat("SSP(s=", staleness, ")")
                                       : "ASP";
  absl::StrAppend(&s, " with ", num_workers, " workers");
  if (backup_workers > 0) absl::StrAppend(&s, " + ", backup_workers, " backup");
  if (elastic_workers > 0) {
    absl::StrAppend(&s, " + ", elastic_workers, " elastic");
  }
  return s;
}

ClockTable::ClockTable(const ConsistencyPolicy& policy)
    : policy_(policy),
      clocks_(policy.max_ranks(), 0),
      retired_(clocks_.size(), false),
      claims_(clocks_.size()),
      joined_(policy.total_workers()) {}

absl::StatusOr<int> ClockTable::Join() {
  if (joined_ >= size()) {
    return absl::ResourceExhaustedError(
        absl::StrCat("every elastic seat is taken (", policy_.elastic_workers,
                     " under ", policy_.ToString(), ")"));
  }
  // Before the seat counts: the gate over the workers already there. Under
  // BSP one beyond it: no worker has started that step, so all of it can
  // count the joiner (the scheduler announces it as the step the job grows
  // at); the step at the gate may be under way with the old count.
  clocks_[joined_] = GatingClock() + (policy_.is_bsp() ? 1 : 0);
  return joined_++;
}

void ClockTable::SetJoined(int joined) {
  joined_ = std::clamp(joined, policy_.total_workers(), size());
}

void ClockTable::Claim(int rank, Clock clock) {
  if (rank >= 0 && rank < size()) claims_[rank].insert(clock);
}

void ClockTable::Unclaim(int rank, Clock clock) {
  if (rank < 0 || rank >= size()) return;
  auto it = claims_[rank].find(clock);
  if (it != claims_[rank].end()) claims_[rank].erase(it);
}

void ClockTable::Retire(int rank) {
  if (rank >= 0 && rank < size()) retired_[rank] = true;
}

absl::Status ClockTable::Advance(int rank, Clock clock, Clock slack) {
  if (rank < 0 || rank >= size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("worker rank ", rank, " outside [0, ", size(), ")"));
  }
  if (rank >= joined_) {
    return absl::FailedPreconditionError(absl::StrCat(
        "worker rank ", rank, " is an elastic seat nobody has joined"));
  }
  if (clock < clocks_[rank]) {
    return absl::FailedPreconditionError(
        absl::StrCat("worker ", rank, " clock moves back from ", clocks_[rank],
                     " to ", clock));
  }
  if (!WithinBound(rank, clock, slack)) {
    return absl::FailedPreconditionError(absl::StrCat(
        "worker ", rank, " clock ", clock, " (recorded ", clocks_[rank],
        ") would be more than ", policy_.bound() + 1 + slack,
        " ahead of the gating clock ", GatingWith(rank, clock), " under ",
        policy_.ToString(), ": it cannot have completed those iterations"));
  }
  clocks_[rank] = clock;
  return absl::OkStatus();
}

absl::Status ClockTable::Restore(int rank, Clock clock) {
  if (rank < 0 || rank >= size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("worker rank ", rank, " outside [0, ", size(), ")"));
  }
  if (clock < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("worker ", rank, ": negative clock ", clock));
  }
  clocks_[rank] = clock;
  return absl::OkStatus();
}

bool ClockTable::WithinBound(int rank, Clock clock, Clock slack) const {
  if (policy_.kind == ConsistencyPolicy::Kind::kAsp) return true;
  std::vector<Clock> clocks = clocks_;
  for (int r = 0; r < size(); ++r) {
    if (!claims_[r].empty())
      clocks[r] = std::max(clocks[r], *claims_[r].rbegin());
  }
  clocks[rank] = clock;
  const Clock gating = Gating(std::move(clocks));
  // clock - gating <= bound + 1, written so that it cannot overflow.
  return clock <= gating || clock - gating - 1 <= policy_.bound() + slack;
}

Clock ClockTable::GatingWith(int rank, Clock clock) const {
  std::vector<Clock> clocks = clocks_;
  clocks[rank] = clock;
  return Gating(clocks);
}

Clock ClockTable::GatingClock() const { return Gating(clocks_); }

Clock ClockTable::Gating(std::vector<Clock> clocks) const {
  std::vector<Clock> gate;
  gate.reserve(clocks.size());
  for (int r = 0; r < size(); ++r) {
    if (counted(r)) gate.push_back(clocks[r]);
  }
  if (gate.empty()) {
    return *std::max_element(clocks.begin(), clocks.begin() + joined_);
  }
  const int n = std::min<int>(policy_.num_workers, gate.size());
  if (policy_.backup_workers == 0 || n == static_cast<int>(gate.size())) {
    return *std::min_element(gate.begin(), gate.end());
  }
  // The N-th largest: the clock that N workers have all reached.
  std::nth_element(gate.begin(), gate.begin() + (n - 1), gate.end(),
                   std::greater<Clock>());
  return gate[n - 1];
}

bool ClockTable::MayProceed(Clock clock) const {
  return policy_.is_asp() || policy_.Allows(clock, GatingClock());
}

void StalenessTracker::Applied(int rank, Clock clock) {
  if (rank < 0 || rank >= static_cast<int>(applied_.size())) return;
  applied_[rank] = std::max(applied_[rank], clock + 1);
}

Clock StalenessTracker::Observe(Clock clock) {
  std::vector<Clock>& live = scratch_;  // reused: Observe runs per pull
  live.clear();
  for (size_t r = 0; r < applied_.size(); ++r) {
    if (!retired_[r] && static_cast<int>(r) < joined_) {
      live.push_back(applied_[r]);
    }
  }
  if (live.empty()) return 0;
  // The counted fastest gate progress: the counted-th largest count.
  const size_t counted = std::min(live.size(), static_cast<size_t>(counted_));
  std::nth_element(live.begin(), live.begin() + (counted - 1), live.end(),
                   std::greater<Clock>());
  const Clock oldest_missing = live[counted - 1];
  const Clock staleness = std::max<Clock>(0, clock - oldest_missing);
  max_observed_ = std::max(max_observed_, staleness);
  return staleness;
}

void StalenessTracker::SetJoined(int joined,
                                 const std::vector<Clock>& seat_starts) {
  const int tracked = static_cast<int>(applied_.size());
  joined_ = joined <= 0 || joined > tracked ? tracked : joined;
  const int first = joined_ - static_cast<int>(seat_starts.size());
  for (int i = 0; i < static_cast<int>(seat_starts.size()); ++i) {
    if (first + i >= 0 && seat_starts[i] > 0) {
      Applied(first + i, seat_starts[i] - 1);
    }
  }
}

void StalenessTracker::Retire(int rank) {
  if (rank >= 0 && rank < static_cast<int>(retired_.size())) {
    retired_[rank] = true;
  }
}

}  // namespace downpour
