#include "scheduler/job.h"

#include <algorithm>
#include <limits>

#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "common/status_macros.h"
#include "google/protobuf/util/message_differencer.h"

namespace downpour {

Job::Job(const JobOptions& options, proto::ClusterMap* map,
         const Membership* members, DurableState* durable)
    : options_(options),
      map_(map),
      members_(members),
      durable_(durable),
      clocks_(options.policy),
      roster_(options.policy, options.worker_loss) {
  options.policy.ToJob(&config_);
  workers_.resize(clocks_.size());
  for (int r = 0; r < clocks_.size(); ++r) workers_[r].set_rank(r);
  // Servers leave vacant seats out of their staleness figures.
  if (options.policy.elastic_workers > 0 && map_->job_workers() == 0) {
    map_->set_job_workers(static_cast<uint32_t>(clocks_.joined()));
  }
}

absl::StatusOr<int> Job::GrantRank(const proto::RegisterRequest& req,
                                   const proto::NodeInfo* node) const {
  const int size = clocks_.size();
  const auto old = node == nullptr ? rank_of_.end() : rank_of_.find(node->id());
  int want = -1;
  if (req.has_requested_rank()) {
    want = req.requested_rank();
    if (want < 0 || want >= size) {
      return absl::InvalidArgumentError(
          absl::StrCat("register: worker '", req.name(), "' asks for rank ",
                       want, ", outside the job's ranks [0, ", size,
                       ") (num_workers + backup_workers + elastic_workers)"));
    }
    if (want > clocks_.joined()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "register: worker '", req.name(), "' asks for rank ", want,
          ", an elastic seat; seats are taken in order, the next is ",
          clocks_.joined()));
    }
    if (old != rank_of_.end() && old->second != want) {
      return absl::FailedPreconditionError(absl::StrCat(
          "register: worker '", req.name(), "' held rank ", old->second,
          " and asks for rank ", want, "; a name keeps its rank"));
    }
  } else if (old != rank_of_.end()) {
    want = old->second;
  } else if (node != nullptr) {
    // Its rank went to another worker meanwhile.
    return absl::AlreadyExistsError(
        absl::StrCat("register: worker '", req.name(),
                     "' lost its rank to another worker while it was dead"));
  } else {
    // A rank of the job nobody holds (not one it went on without), else the
    // next elastic seat.
    for (int r = 0; r < clocks_.joined() && want < 0; ++r) {
      if (!rank_holder_.contains(r) && !roster_.retired(r)) want = r;
    }
    if (want < 0 && clocks_.joined() < size) want = clocks_.joined();
    if (want < 0) {
      return absl::ResourceExhaustedError(
          absl::StrCat("register: the job has ", size, " workers already",
                       options_.policy.elastic_workers > 0
                           ? absl::StrCat(" (", options_.policy.elastic_workers,
                                          " elastic seats, all taken)")
                           : ""));
    }
  }
  const auto held = rank_holder_.find(want);
  if (held != rank_holder_.end() &&
      (node == nullptr || held->second != node->id())) {
    const proto::NodeInfo* holder = members_->Find(held->second);
    if (holder != nullptr && holder->state() == proto::ALIVE) {
      return absl::AlreadyExistsError(absl::StrCat(
          "register: rank ", want, " is held by worker '", holder->name(),
          "' (node ", holder->id(), "), which is alive"));
    }
  }
  return want;
}

absl::Status Job::TakeOverRank(int rank, const std::string& name) {
  const bool was_lost = roster_.lost(rank);
  DP_RETURN_IF_ERROR(roster_.Replaced(rank), "register: worker '", name, "'");
  if (was_lost) {
    DP_LOG(INFO) << "worker '" << name << "' replaces the lost worker of "
                 << "rank " << rank << " from clock " << clocks_.clock(rank);
  }
  workers_[rank].set_lost(false);
  workers_[rank].set_finished(false);
  if (rank >= clocks_.joined()) {
    // GrantRank gave the next seat: the worker joins the running job.
    DP_ASSIGN_OR_RETURN(const int seat, clocks_.Join(), "register: worker '",
                        name, "'");
    DP_CHECK(seat == rank);
    workers_[rank].set_clock(clocks_.clock(rank));
    map_->set_job_workers(static_cast<uint32_t>(clocks_.joined()));
    map_->add_seat_clocks(clocks_.clock(rank));
    map_->set_epoch(map_->epoch() + 1);
    map_->add_seat_epochs(map_->epoch());
    durable_->ClocksChanged();
    DP_LOG(INFO) << "worker '" << name << "' joins the running job in elastic "
                 << "seat " << rank << " from clock " << clocks_.clock(rank)
                 << "; " << clocks_.joined() << " ranks; epoch "
                 << map_->epoch()
                 << (options_.policy.is_bsp()
                         ? "; BSP steps count it from there, once every live "
                           "server has applied this epoch"
                         : "");
  }
  return absl::OkStatus();
}

Clock Job::ResizeHold() const {
  Clock hold = std::numeric_limits<Clock>::max();
  if (!options_.policy.is_bsp() || map_->seat_epochs_size() == 0) return hold;
  const std::vector<const proto::NodeInfo*> servers = members_->AliveServers();
  const int n = std::min(map_->seat_clocks_size(), map_->seat_epochs_size());
  const Clock gating = clocks_.GatingClock();
  for (int i = 0; i < n; ++i) {
    // The gate passes a seat's start clock only once the hold is lifted;
    // up to it (every worker has completed the step before) it may still
    // be on.
    const Clock step = map_->seat_clocks(i);
    if (step < gating || step - 1 >= hold) continue;
    for (const proto::NodeInfo* s : servers) {
      if (members_->applied(s->id()) < map_->seat_epochs(i)) {
        hold = step - 1;
        break;
      }
    }
  }
  return hold;
}

Clock Job::GatingClock() const {
  return std::min(clocks_.GatingClock(), ResizeHold());
}

bool Job::MayProceed(Clock clock) const {
  return options_.policy.Allows(clock, GatingClock());
}

absl::Status Job::LeaveForGood(NodeId id, const std::string& name,
                               const std::string& how) {
  const auto it = rank_of_.find(id);
  if (it == rank_of_.end()) return absl::OkStatus();
  const int rank = it->second;
  if (options_.policy.is_bsp()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "leave: worker '", name, "' (rank ", rank,
        ") cannot leave a BSP job for good: a BSP job grows at announced "
        "steps but does not shrink; leave without retire (a replacement "
        "takes the rank) or use --on_worker_loss=continue"));
  }
  if (roster_.retired(rank)) return absl::OkStatus();
  RetireNow(rank, name, how);
  return absl::OkStatus();
}

void Job::RetireNow(int rank, const std::string& name, const std::string& how) {
  asked_to_leave_.erase(rank);
  roster_.Retire(rank, name, how);
  clocks_.Retire(rank);
  workers_[rank].set_lost(false);
  workers_[rank].set_retired(true);
  map_->add_retired_ranks(rank);
  std::sort(map_->mutable_retired_ranks()->begin(),
            map_->mutable_retired_ranks()->end());
  map_->set_epoch(map_->epoch() + 1);
  DP_LOG(INFO) << "worker '" << name << "' (rank " << rank << ", clock "
               << clocks_.clock(rank) << ") left the job for good: " << how;
}

absl::StatusOr<proto::RetireWorkerReply> Job::Retire(int rank) {
  if (rank < 0 || rank >= clocks_.joined()) {
    return absl::InvalidArgumentError(
        absl::StrCat("retire: rank ", rank, " is not in the job (ranks [0, ",
                     clocks_.joined(), ") have joined)"));
  }
  proto::RetireWorkerReply reply;
  const auto holder = rank_holder_.find(rank);
  const proto::NodeInfo* node =
      holder == rank_holder_.end() ? nullptr : members_->Find(holder->second);
  if (node != nullptr) {
    reply.set_node_id(node->id());
    reply.set_name(node->name());
  }
  if (roster_.retired(rank)) {
    reply.set_retired(true);
    return reply;
  }
  if (options_.policy.is_bsp()) {
    return absl::FailedPreconditionError(
        absl::StrCat("retire: rank ", rank,
                     " of a BSP job: a BSP job grows at announced "
                     "steps but does not shrink"));
  }
  int others = 0;
  for (int r = 0; r < clocks_.joined(); ++r) {
    others += r != rank && !roster_.retired(r) ? 1 : 0;
  }
  if (others == 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("retire: rank ", rank,
                     " is the last rank of the job not retired; "
                     "stop the job instead"));
  }
  if (node != nullptr && node->state() == proto::ALIVE) {
    if (asked_to_leave_.insert(rank).second) {
      DP_LOG(INFO) << "worker '" << node->name() << "' (rank " << rank
                   << ") is asked to leave the job for good (retire)";
    }
    reply.set_asked(true);
    return reply;
  }
  // Nobody will leave: retired here, as a lost worker's rank the job goes
  // on without.
  RetireNow(rank, node == nullptr ? "" : node->name(),
            "retired by the operator while no live worker held it");
  workers_[rank].set_finished(false);
  reply.set_retired(true);
  return reply;
}

void Job::Assign(int rank, NodeId node) {
  // A DEAD worker that held this rank gives it up.
  auto held = rank_holder_.find(rank);
  if (held != rank_holder_.end() && held->second != node) {
    rank_of_.erase(held->second);
  }
  rank_holder_[rank] = node;
  rank_of_[node] = rank;
}

int Job::RankOf(NodeId node) const {
  const auto r = rank_of_.find(node);
  return r == rank_of_.end() ? -1 : r->second;
}

absl::Status Job::CheckRankHolder(absl::string_view what, NodeId node,
                                  int rank) const {
  if (rank < 0 || rank >= clocks_.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": rank ", rank, " outside the job's ranks [0, ",
                     clocks_.size(), ")"));
  }
  const auto holder = rank_holder_.find(rank);
  if (holder != rank_holder_.end() && holder->second == node &&
      node != kNoNode) {
    return absl::OkStatus();
  }
  std::string held = "no worker holds it";
  if (holder != rank_holder_.end()) {
    const proto::NodeInfo* h = members_->Find(holder->second);
    held = absl::StrCat("node ", holder->second, " ('",
                        h == nullptr ? "" : h->name(), "') holds it");
  }
  return absl::PermissionDeniedError(
      absl::StrCat(what, ": node ", node, " does not hold rank ", rank, " (",
                   held, "); a worker reports only its own clock"));
}

void Job::WorkerGone(NodeId id, const std::string& name, const std::string& how,
                     bool finished, absl::Time now) {
  const auto it = rank_of_.find(id);
  if (it == rank_of_.end()) return;
  const int rank = it->second;
  if (roster_.retired(rank)) return;  // it left for good
  if (finished) {
    roster_.Finished(rank);
    workers_[rank].set_finished(true);
  } else {
    roster_.Lost(rank, name, how, now);
    if (roster_.lost(rank)) {
      DP_LOG(WARNING) << "worker '" << name << "' (rank " << rank << ", clock "
                      << clocks_.clock(rank) << ") lost: " << how
                      << "; waiting up to "
                      << absl::FormatDuration(
                             options_.worker_loss.replace_timeout)
                      << " for a replacement";
    }
  }
  workers_[rank].set_lost(roster_.lost(rank));
}

void Job::ApplyWorkerLossRule(absl::Time now) {
  const bool failed_before = !roster_.failure().ok();
  const std::vector<int> retired = roster_.Check(now);
  for (int rank : retired) {
    clocks_.Retire(rank);
    workers_[rank].set_lost(false);
    workers_[rank].set_retired(true);
    // The servers complete the BSP steps held for it and leave it out of
    // their staleness figures.
    map_->add_retired_ranks(rank);
  }
  if (!retired.empty()) {
    std::sort(map_->mutable_retired_ranks()->begin(),
              map_->mutable_retired_ranks()->end());
    map_->set_epoch(map_->epoch() + 1);
  }
  // On disk: a restarted scheduler keeps the rank retired, or the job
  // failed.
  if (!retired.empty() || failed_before != !roster_.failure().ok()) {
    durable_->Commit();
  }
}

namespace {
// Epochs whose split the scheduler remembers; also how far beyond the
// newest a worker may ask (a wild epoch would push the others' out).
constexpr int64_t kEpochSplitsKept = 64;
}  // namespace

absl::StatusOr<std::vector<int>> Job::EpochSplit(int64_t epoch,
                                                 bool* fixed_now) {
  *fixed_now = false;
  if (epoch < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("epoch split: negative epoch ", epoch));
  }
  if (const auto it = epoch_splits_.find(epoch); it != epoch_splits_.end()) {
    return it->second;
  }
  if (!epoch_splits_.empty()) {
    const int64_t oldest = epoch_splits_.begin()->first;
    const int64_t newest = epoch_splits_.rbegin()->first;
    if (epoch < oldest &&
        epoch_splits_.size() >= static_cast<size_t>(kEpochSplitsKept)) {
      return absl::OutOfRangeError(absl::StrCat(
          "epoch split: epoch ", epoch, " is forgotten (the scheduler keeps ",
          kEpochSplitsKept, " epochs' splits, the oldest ", oldest, ")"));
    }
    if (epoch - newest > kEpochSplitsKept) {
      return absl::InvalidArgumentError(absl::StrCat(
          "epoch split: epoch ", epoch, " is more than ", kEpochSplitsKept,
          " beyond the newest split (epoch ", newest, ")"));
    }
  }
  // The workers in the job now: a lost one's replacement takes its share;
  // a finished or retired one trains no more.
  std::vector<int> ranks;
  for (int r = 0; r < clocks_.joined(); ++r) {
    if (!roster_.retired(r) && !roster_.finished(r)) ranks.push_back(r);
  }
  epoch_splits_[epoch] = ranks;
  while (epoch_splits_.size() > static_cast<size_t>(kEpochSplitsKept)) {
    epoch_splits_.erase(epoch_splits_.begin());
  }
  *fixed_now = true;
  DP_LOG(INFO) << "epoch " << epoch << " is split over " << ranks.size()
               << " worker(s)";
  return ranks;
}

void Job::ForgetNode(NodeId id) {
  if (auto r = rank_of_.find(id); r != rank_of_.end()) {
    auto h = rank_holder_.find(r->second);
    if (h != rank_holder_.end() && h->second == id) rank_holder_.erase(h);
    rank_of_.erase(r);
  }
}

absl::Status Job::Advance(const proto::AdvanceClockRequest& req,
                          proto::AdvanceClockReply* reply) {
  absl::Status s =
      clocks_.Advance(req.rank(), req.clock(), options_.clock_report_slack);
  if (!s.ok()) {
    return Annotate(s, absl::StrCat("advance clock of rank ", req.rank(),
                                    " from node ", req.node_id()));
  }
  durable_->ClocksChanged();
  proto::WorkerStatus& w = workers_[req.rank()];
  w.set_clock(req.clock());
  w.set_loss(req.loss());
  w.set_examples(req.examples());
  if (req.test_accuracy() >= 0) w.set_test_accuracy(req.test_accuracy());
  w.set_max_staleness(std::max(w.max_staleness(), req.max_staleness()));
  w.set_discarded(req.discarded());
  reply->set_gating_clock(GatingClock());
  // A lower bound on the gate the worker may go by without asking
  // (JobMember::WaitClock): held below an announced BSP step too.
  Clock others = ResizeHold();
  for (int r = 0; r < clocks_.size(); ++r) {
    if (r != req.rank() && !clocks_.retired(r)) {
      others = std::min(others, clocks_.clock(r));
    }
  }
  reply->set_others_min_clock(others);
  return absl::OkStatus();
}

void Job::SetClocks(const proto::CheckpointManifest& m) {
  clocks_ = ClockTable(options_.policy);
  clocks_.SetJoined(static_cast<int>(map_->job_workers()));
  for (auto& w : workers_) w = proto::WorkerStatus();
  for (int r = 0; r < clocks_.size(); ++r) workers_[r].set_rank(r);
  std::vector<bool> recorded(clocks_.size(), false);
  for (const proto::WorkerStatus& w : m.workers()) {
    if (w.rank() < 0 || w.rank() >= clocks_.size()) continue;
    if (clocks_.Restore(w.rank(), w.clock()).ok()) {
      workers_[w.rank()] = w;
      recorded[w.rank()] = true;
    }
  }
  // A seat joined after that checkpoint starts at its gating clock, as a
  // worker joining then would have; under BSP not before the step the job
  // grew at, which the servers keep counting it from.
  const Clock gating = clocks_.GatingClock();
  const int first_seat = options_.policy.total_workers();
  const int seat_clocks_from =
      static_cast<int>(map_->job_workers()) - map_->seat_clocks_size();
  for (int r = first_seat; r < clocks_.joined(); ++r) {
    Clock start = gating;
    const int i = r - seat_clocks_from;
    if (options_.policy.is_bsp() && i >= 0 && i < map_->seat_clocks_size()) {
      start = std::max(start, map_->seat_clocks(i));
    }
    if (!recorded[r] && clocks_.Restore(r, start).ok()) {
      workers_[r].set_clock(start);
    }
  }
  // A rank the job went on without stays out of the gate: the roster
  // refuses a replacement for it, so nothing would ever advance it.
  for (int r = 0; r < clocks_.size(); ++r) {
    workers_[r].set_lost(roster_.lost(r));
    workers_[r].set_retired(roster_.retired(r));
    if (roster_.retired(r)) clocks_.Retire(r);
  }
  durable_->ClocksChanged();
}

void Job::FillJobStatus(proto::JobStatus* status) const {
  *status->mutable_job() = config_;
  status->set_gating_clock(GatingClock());
  // Vacant elastic seats are no workers.
  for (int r = 0; r < clocks_.joined(); ++r)
    *status->add_workers() = workers_[r];
  if (!roster_.failure().ok()) {
    status->set_failure(std::string(roster_.failure().message()));
  }
}

proto::SchedulerClocks Job::ClocksSnapshot() const {
  proto::SchedulerClocks clocks;
  for (int r = 0; r < clocks_.size(); ++r) {
    proto::WorkerStatus* w = clocks.add_workers();
    *w = workers_[r];
    w->set_clock(clocks_.clock(r));
  }
  return clocks;
}

void Job::Export(proto::SchedulerState* state) const {
  *state->mutable_job() = config_;
  for (const auto& [node, rank] : rank_of_) {
    proto::SchedulerState::Rank* r = state->add_ranks();
    r->set_rank(rank);
    r->set_node(node);
  }
  *state->mutable_roster() = roster_.Export();
  for (const auto& [epoch, ranks] : epoch_splits_) {
    proto::SchedulerState::EpochSplit* e = state->add_epoch_splits();
    e->set_epoch(epoch);
    e->mutable_ranks()->Add(ranks.begin(), ranks.end());
  }
}

absl::Status Job::CheckSameJob(const proto::SchedulerState& state,
                               const std::string& dir) const {
  if (google::protobuf::util::MessageDifferencer::Equals(state.job(),
                                                         config_)) {
    return absl::OkStatus();
  }
  return absl::FailedPreconditionError(absl::StrCat(
      "state dir ", dir, " holds another job (", state.job().ShortDebugString(),
      "); the flags give (", config_.ShortDebugString(),
      "): start with the same --consistency, --staleness, --num_workers, "
      "--backup_workers and --elastic_workers, or use a new --state_dir"));
}

void Job::Import(const proto::SchedulerState& state,
                 const proto::SchedulerClocks& clocks, uint64_t restored_from,
                 const proto::CheckpointManifest* restored) {
  roster_.Import(state.roster());
  clocks_.SetJoined(static_cast<int>(state.map().job_workers()));
  epoch_splits_.clear();
  for (const proto::SchedulerState::EpochSplit& e : state.epoch_splits()) {
    epoch_splits_[e.epoch()].assign(e.ranks().begin(), e.ranks().end());
  }
  for (const auto& r : state.ranks()) {
    if (r.rank() < 0 || r.rank() >= clocks_.size()) continue;
    rank_of_[r.node()] = r.rank();
    rank_holder_[r.rank()] = r.node();
  }
  // Clocks written before the last restore are not the job's any more.
  if (clocks.restored_from() == restored_from) {
    for (int r = 0; r < clocks.workers_size() && r < clocks_.size(); ++r) {
      const proto::WorkerStatus& w = clocks.workers(r);
      if (clocks_.Restore(r, w.clock()).ok()) workers_[r] = w;
      workers_[r].set_rank(r);
    }
  } else if (restored != nullptr) {
    SetClocks(*restored);
  }
  // The roster on disk is newer than the clocks (it is synced).
  for (int r = 0; r < clocks_.size(); ++r) {
    workers_[r].set_lost(roster_.lost(r));
    workers_[r].set_retired(roster_.retired(r));
    if (roster_.finished(r)) workers_[r].set_finished(true);
    if (roster_.retired(r)) clocks_.Retire(r);
  }
}

}  // namespace downpour
