#include "scheduler/worker_roster.h"

#include "absl/strings/str_cat.h"
#include "common/logging.h"

namespace downpour {

absl::StatusOr<WorkerLossOptions::OnLoss> WorkerLossOptions::ParseOnLoss(
    const std::string& name) {
  if (name == "stop") return OnLoss::kStop;
  if (name != "continue") {
    return absl::InvalidArgumentError(
        absl::StrCat("--on_worker_loss=", name, ": must be stop or continue"));
  }
  return OnLoss::kContinue;
}

WorkerRoster::WorkerRoster(const ConsistencyPolicy& policy,
                           const WorkerLossOptions& o)
    : policy_(policy), options_(o), state_(policy.max_ranks()) {}

void WorkerRoster::Lost(int rank, const std::string& name,
                        const std::string& how, absl::Time now) {
  if (!Valid(rank)) return;
  RankState& s = state_[rank];
  if (s.finished || s.lost || s.retired) return;
  s.lost = true;
  s.name = name;
  s.how = how;
  s.since = now;
}

void WorkerRoster::Finished(int rank) {
  if (!Valid(rank)) return;
  state_[rank].finished = true;
  state_[rank].lost = false;
}

absl::Status WorkerRoster::Replaced(int rank) {
  if (!Valid(rank)) return absl::OkStatus();
  RankState& s = state_[rank];
  if (s.retired) {
    return absl::FailedPreconditionError(absl::StrCat(
        "rank ", rank, " was given up after worker '", s.name, "' was lost (",
        s.how, ") and not replaced within ",
        absl::FormatDuration(options_.replace_timeout),
        "; the job went on without it (--on_worker_loss=continue)"));
  }
  s.lost = false;
  s.finished = false;
  return absl::OkStatus();
}

void WorkerRoster::Retire(int rank, const std::string& name,
                          const std::string& how) {
  if (!Valid(rank)) return;
  RankState& s = state_[rank];
  s.lost = false;
  s.finished = false;
  s.retired = true;
  s.name = name;
  s.how = how;
}

proto::WorkerRosterState WorkerRoster::Export() const {
  proto::WorkerRosterState out;
  for (int r = 0; r < static_cast<int>(state_.size()); ++r) {
    const RankState& s = state_[r];
    if (!s.lost && !s.retired && !s.finished) continue;
    proto::WorkerRosterState::Rank* rank = out.add_ranks();
    rank->set_rank(r);
    rank->set_lost(s.lost);
    rank->set_retired(s.retired);
    rank->set_finished(s.finished);
    rank->set_name(s.name);
    rank->set_how(s.how);
    rank->set_since_unix_ms(absl::ToUnixMillis(s.since));
  }
  if (!failure_.ok()) out.set_failure(std::string(failure_.message()));
  return out;
}

void WorkerRoster::Import(const proto::WorkerRosterState& state) {
  state_.assign(state_.size(), RankState());
  for (const proto::WorkerRosterState::Rank& r : state.ranks()) {
    if (!Valid(r.rank())) continue;
    RankState& s = state_[r.rank()];
    s.lost = r.lost();
    s.retired = r.retired();
    s.finished = r.finished();
    s.name = r.name();
    s.how = r.how();
    s.since = absl::FromUnixMillis(r.since_unix_ms());
  }
  failure_ = state.failure().empty() ? absl::OkStatus()
                                     : absl::AbortedError(state.failure());
}

int WorkerRoster::NotWaitedFor() const {
  int lost = 0, retired = 0;
  for (const RankState& s : state_) {
    lost += s.lost ? 1 : 0;
    retired += s.retired ? 1 : 0;
  }
  return retired + (lost <= policy_.backup_workers ? lost : 0);
}

std::vector<int> WorkerRoster::Check(absl::Time now) {
  std::vector<int> retire;
  if (!failure_.ok()) return retire;
  int lost = 0;
  for (const RankState& s : state_) lost += s.lost ? 1 : 0;
  // Backup workers absorb this many losses: the N fastest go on.
  if (lost <= policy_.backup_workers) return retire;
  for (int r = 0; r < static_cast<int>(state_.size()); ++r) {
    RankState& s = state_[r];
    if (!s.lost || now - s.since < options_.replace_timeout) continue;
    if (options_.on_loss == WorkerLossOptions::OnLoss::kStop) {
      failure_ = absl::AbortedError(absl::StrCat(
          "the job stopped: worker '", s.name, "' (rank ", r, ") was lost (",
          s.how, ") and no replacement registered within ",
          absl::FormatDuration(options_.replace_timeout),
          " (--on_worker_loss=stop)"));
      DP_LOG(ERROR) << failure_.message();
      return {};
    }
    s.lost = false;
    s.retired = true;
    retire.push_back(r);
    DP_LOG(WARNING) << "worker '" << s.name << "' (rank " << r
                    << ") not replaced within "
                    << absl::FormatDuration(options_.replace_timeout)
                    << "; the job goes on without it "
                    << "(--on_worker_loss=continue)";
  }
  return retire;
}

}  // namespace downpour
