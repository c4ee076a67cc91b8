#include "consistency/consistency.h"

#include <algorithm>

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
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<ConsistencyPolicy> ConsistencyPolicy::Parse(
    const std::string& name, Clock staleness, int num_workers,
    int backup_workers) {
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
  p.num_workers = num_workers;
  p.backup_workers = backup_workers;
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
  const uint64_t n = job.num_workers(), b = job.backup_workers();
  if (n > static_cast<uint64_t>(std::numeric_limits<int>::max()) ||
      b > static_cast<uint64_t>(std::numeric_limits<int>::max())) {
    return absl::InvalidArgumentError(
        absl::StrCat("job config with ", n, " + ", b, " workers"));
  }
  const absl::Status counts =
      CheckCounts(p.staleness, static_cast<int>(n), static_cast<int>(b));
  if (!counts.ok()) return counts;
  p.num_workers = static_cast<int>(n);
  p.backup_workers = static_cast<int>(b);
  return p;
}

void ConsistencyPolicy::ToJob(proto::JobConfig* job) const {
  job->set_consistency(kind == Kind::kBsp   ? proto::BSP
                       : kind == Kind::kSsp ? proto::SSP
                                            : proto::ASP);
  job->set_staleness(kind == Kind::kSsp ? staleness : 0);
  job->set_num_workers(static_cast<uint32_t>(num_workers));
  job->set_backup_workers(static_cast<uint32_t>(backup_workers));
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
  return s;
}

ClockTable::ClockTable(const ConsistencyPolicy& policy)
    : policy_(policy),
      clocks_(policy.num_workers + policy.backup_workers, 0),
      retired_(clocks_.size(), false),
      claims_(clocks_.size()) {}

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
  std::vector<Clock> counted;
  counted.reserve(clocks.size());
  for (int r = 0; r < size(); ++r) {
    if (!retired_[r]) counted.push_back(clocks[r]);
  }
  if (counted.empty()) {
    return *std::max_element(clocks.begin(), clocks.end());
  }
  const int n = std::min<int>(policy_.num_workers, counted.size());
  if (policy_.backup_workers == 0 || n == static_cast<int>(counted.size())) {
    return *std::min_element(counted.begin(), counted.end());
  }
  // The N-th largest: the clock that N workers have all reached.
  std::nth_element(counted.begin(), counted.begin() + (n - 1), counted.end(),
                   std::greater<Clock>());
  return counted[n - 1];
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
    if (!retired_[r]) live.push_back(applied_[r]);
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

void StalenessTracker::Retire(int rank) {
  if (rank >= 0 && rank < static_cast<int>(retired_.size())) {
    retired_[rank] = true;
  }
}

}  // namespace downpour
