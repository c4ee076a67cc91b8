#include "client/job_member.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <optional>
#include <random>
#include <set>
#include <thread>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "cluster/scheduler_client.h"
#include "common/logging.h"
#include "common/status_macros.h"
#include "proto/downpour.pb.h"

namespace downpour {
namespace {

// Sends a worker's AdvanceClock calls from its own thread, so that the
// training loop does not wait for the scheduler when the policy does not
// make it. Calls go out in order; one still queued when a newer one comes
// is replaced by it (clocks only move forward, and the newer progress
// figures supersede the older, except an evaluation's accuracy, which is
// kept). Each reply tells the smallest clock of the other workers, a lower
// bound that only grows. A report the scheduler does not answer (down,
// restarting, or restoring the job) is sent again until it is, unless a
// newer one replaced it; other errors are kept for the next Advance.
// Thread-safe.
class ClockReporter {
 public:
  // `scheduler` must outlive this object. Clocks start at `start_clock`;
  // the others' are taken to be at least `others` (<= start_clock).
  ClockReporter(SchedulerClient* scheduler, Clock start_clock, Clock others)
      : scheduler_(scheduler), own_clock_(start_clock), others_(others) {
    thread_ = std::thread([this] { Loop(); });
  }
  // Sends what is still queued, then stops.
  ~ClockReporter() {
    {
      absl::MutexLock lock(&mu_);
      stop_ = true;
    }
    thread_.join();
  }

  // Queues the report; returns the first error a previous one got.
  absl::Status Advance(proto::AdvanceClockRequest req)
      ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    if (pending_ && req.test_accuracy() < 0) {
      req.set_test_accuracy(pending_->test_accuracy());
    }
    own_clock_ = req.clock();
    pending_ = std::move(req);
    return error_;
  }
  // Waits until every queued report has been sent; its first error.
  absl::Status Flush(absl::Duration timeout) ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    auto idle = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return !pending_ && !in_flight_;
    };
    if (!mu_.AwaitWithTimeout(absl::Condition(&idle), timeout)) {
      return absl::DeadlineExceededError(
          absl::StrCat("clock report ", own_clock_, " still queued after ",
                       absl::FormatDuration(timeout)));
    }
    return error_;
  }
  Clock own_clock() const ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    return own_clock_;
  }
  Clock others_lower_bound() const ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    return others_;
  }
  // A gating clock learnt elsewhere (WaitClock): the others are at least
  // there.
  void ObserveGating(Clock gating) ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    others_ = std::max(others_, gating);
  }

 private:
  void Loop() ABSL_LOCKS_EXCLUDED(mu_) {
    for (;;) {
      proto::AdvanceClockRequest req;
      {
        absl::MutexLock lock(&mu_);
        auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
          return stop_ || pending_.has_value();
        };
        // Re-checked every second; Advance and the destructor wake it.
        mu_.AwaitWithTimeout(absl::Condition(&ready), absl::Seconds(1));
        if (!pending_) {
          if (stop_) return;
          continue;
        }
        req = std::move(*pending_);
        pending_.reset();
        in_flight_ = true;
      }
      auto reply = scheduler_->AdvanceClock(req);  // not under the lock
      absl::MutexLock lock(&mu_);
      in_flight_ = false;
      if (reply.ok()) {
        if (retrying_)
          DP_LOG(INFO) << "clock reports reach the scheduler again";
        retrying_ = false;
        others_ = std::max(others_, reply->others_min_clock());
        continue;
      }
      const absl::StatusCode code = reply.status().code();
      if (code != absl::StatusCode::kUnavailable &&
          code != absl::StatusCode::kDeadlineExceeded) {
        if (error_.ok()) error_ = reply.status();
        continue;
      }
      if (!retrying_) {
        DP_LOG(WARNING) << reply.status() << "; sending it again";
        retrying_ = true;
      }
      if (!pending_) pending_ = std::move(req);
      mu_.AwaitWithTimeout(absl::Condition(&stop_), absl::Milliseconds(200));
      if (stop_) return;
    }
  }

  SchedulerClient* const scheduler_;
  mutable absl::Mutex mu_;
  std::optional<proto::AdvanceClockRequest> pending_ ABSL_GUARDED_BY(mu_);
  bool in_flight_ ABSL_GUARDED_BY(mu_) = false;
  bool retrying_ ABSL_GUARDED_BY(mu_) = false;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status error_ ABSL_GUARDED_BY(mu_);
  Clock own_clock_ ABSL_GUARDED_BY(mu_);
  Clock others_ ABSL_GUARDED_BY(mu_);
  std::thread thread_;
};

const absl::Status& StatusOf(const absl::Status& s) { return s; }
template <typename T>
const absl::Status& StatusOf(const absl::StatusOr<T>& s) {
  return s.status();
}

// Calls `call(time left)` again while it fails with kUnavailable (the
// scheduler down, restarting or restoring the job: members keep going
// through its outage), until `timeout` has passed.
template <typename F>
auto RetryThroughOutage(F call, absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  bool logged = false;
  while (true) {
    auto r = call(std::max(deadline - absl::Now(), absl::Milliseconds(1)));
    if (StatusOf(r).code() != absl::StatusCode::kUnavailable ||
        absl::Now() + absl::Milliseconds(200) >= deadline) {
      return r;
    }
    if (!logged) {
      DP_LOG(WARNING) << StatusOf(r) << "; trying again";
      logged = true;
    }
    absl::SleepFor(absl::Milliseconds(200));
  }
}

// Random, drawn once per process; never 0 (0 means "not given").
uint64_t ProcessIncarnation() {
  static const uint64_t incarnation = [] {
    std::random_device rd;
    const uint64_t now = static_cast<uint64_t>(
        std::chrono::steady_clock::now().time_since_epoch().count());
    return ((static_cast<uint64_t>(rd()) << 32) ^ rd() ^ now) | 1;
  }();
  return incarnation;
}

// The names held by live members of this process (they share one
// incarnation, so the scheduler cannot tell a second Join from a retry).
class NameSet {
 public:
  bool Take(const std::string& name) ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    return names_.insert(name).second;
  }
  void Release(const std::string& name) ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    names_.erase(name);
  }

 private:
  absl::Mutex mu_;
  std::set<std::string> names_ ABSL_GUARDED_BY(mu_);
};
NameSet& LiveNames() {
  static NameSet* names = new NameSet();
  return *names;
}

class JobMemberImpl final : public JobMember {
 public:
  explicit JobMemberImpl(const JobMemberOptions& o)
      : options_(o), scheduler_(o.scheduler_address, o.rpc_timeout, o.auth) {}
  ~JobMemberImpl() override {
    ReleaseName();
    StopHeartbeats();
    reporter_.reset();  // before scheduler_, which it calls
  }

  absl::Status Init() {
    if (!options_.name.empty()) {
      if (!LiveNames().Take(LiveNameKey())) {
        // Join adds "join the job as '<name>'".
        return absl::AlreadyExistsError(
            "a live member of this process already has the name");
      }
      absl::MutexLock lock(&hb_mu_);
      holds_name_ = true;
    }
    proto::RegisterRequest reg;
    reg.set_role(proto::WORKER);
    reg.set_name(options_.name);
    if (options_.rank >= 0) reg.set_requested_rank(options_.rank);
    // Fixed for the life of the process: a replacement process registering
    // under the name of a worker killed moments ago takes over at once
    // instead of waiting for the scheduler to notice the silence, and a
    // retry of this registration (its reply lost, e.g. to a scheduler
    // restart) keeps what it got. A second member of this process under a
    // live name is refused here (LiveNames), since the scheduler would take
    // it for such a retry.
    reg.set_incarnation(ProcessIncarnation());
    reg.set_job_token(options_.job_token);
    DP_ASSIGN_OR_RETURN(proto::RegisterReply reply,
                        scheduler_.Register(reg, options_.register_timeout));
    id_ = reply.node_id();
    rank_ = reply.rank();
    // The rank's clock in the job (scheduler/scheduler.h): the checkpoint's
    // after a restore, the predecessor's for a replacement.
    start_clock_ = std::max<Clock>(0, reply.start_clock());
    restored_from_ = reply.restored_from();
    passed_barriers_.insert(reply.passed_barriers().begin(),
                            reply.passed_barriers().end());
    DP_ASSIGN_OR_RETURN(policy_, ConsistencyPolicy::FromJob(reply.job()),
                        "scheduler at ", options_.scheduler_address);
    if (rank_ < 0 || rank_ >= policy_.max_ranks()) {
      return absl::InternalError(absl::StrCat(
          "the scheduler gave rank ", rank_, " in a job of ",
          policy_.max_ranks(), " ranks (", policy_.ToString(), ")"));
    }
    // Taken seats' clocks are listed for ranks [job_workers - listed,
    // job_workers), in rank order.
    const proto::ClusterMap& map = reply.map();
    const int first_seat =
        static_cast<int>(map.job_workers()) - map.seat_clocks_size();
    if (rank_ >= policy_.total_workers() && rank_ >= first_seat &&
        rank_ < static_cast<int>(map.job_workers())) {
      first_clock_ = std::max<Clock>(0, map.seat_clocks(rank_ - first_seat));
    }
    const absl::Duration interval =
        reply.heartbeat_interval_ms() > 0
            ? absl::Milliseconds(reply.heartbeat_interval_ms())
            : absl::Milliseconds(500);
    // Keeps the worker alive in the scheduler's eyes while it computes or
    // waits on a slow peer.
    heartbeat_ = std::thread([this, interval] { HeartbeatLoop(interval); });
    // Not the start clock: a BSP joiner starts one step beyond the others,
    // and taking them to be there let it start that step before they had
    // completed the one before (and before every server had the map that
    // counts it).
    reporter_ = std::make_unique<ClockReporter>(
        &scheduler_, start_clock_,
        std::min<Clock>(start_clock_, reply.gating_clock()));
    return absl::OkStatus();
  }

  NodeId node_id() const override { return id_; }

  absl::Status Leave(bool finished, const std::string& reason,
                     absl::Duration timeout) override {
    return LeaveAs(finished, /*retire=*/false, reason, timeout);
  }

  absl::Status LeaveForGood(const std::string& reason,
                            absl::Duration timeout) override {
    // Refused here rather than by the scheduler, so that the member is
    // still in the job (heartbeating) when it is told no.
    if (policy_.is_bsp()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "leave for good: not under ", policy_.ToString(),
          " (BSP changes its number of workers only at a step every server "
          "switches at together, which Downpour does not do yet)"));
    }
    return LeaveAs(/*finished=*/false, /*retire=*/true, reason, timeout);
  }
  int rank() const override { return rank_; }
  const ConsistencyPolicy& policy() const override { return policy_; }
  Clock start_clock() const override { return start_clock_; }
  Clock first_clock() const override { return first_clock_; }
  uint64_t restored_from() const override { return restored_from_; }
  bool BarrierPassed(absl::string_view name) const override {
    return passed_barriers_.contains(name);
  }
  bool asked_to_leave() const override { return asked_to_leave_.load(); }

  absl::Status ReportClock(const ClockReport& report) override {
    proto::AdvanceClockRequest adv;
    adv.set_node_id(id_);
    adv.set_rank(rank_);
    adv.set_clock(report.clock);
    adv.set_loss(report.loss);
    adv.set_examples(report.examples);
    adv.set_test_accuracy(report.test_accuracy);
    adv.set_max_staleness(report.max_staleness);
    adv.set_discarded(report.discarded);
    return reporter_->Advance(std::move(adv));
  }
  absl::Status Flush(absl::Duration timeout) override {
    return reporter_->Flush(timeout);
  }
  Clock reported_clock() const override { return reporter_->own_clock(); }
  Clock others_lower_bound() const override {
    return reporter_->others_lower_bound();
  }

  absl::StatusOr<Clock> WaitClock(Clock clock,
                                  absl::Duration timeout) override {
    return Wait(clock, policy_, kNoTable, timeout);
  }

  absl::StatusOr<Clock> WaitClockForTable(Clock clock, TableId table,
                                          const std::string& consistency,
                                          absl::Duration timeout) override {
    // The table's own policy over the job's workers (the scheduler reads
    // the same from the table's spec: ConsistencyPolicy::ForTable).
    ConsistencyPolicy p = policy_;
    if (consistency == "bsp") {
      p.kind = ConsistencyPolicy::Kind::kBsp;
      p.staleness = 0;
    } else if (consistency == "asp") {
      p.kind = ConsistencyPolicy::Kind::kAsp;
    } else if (absl::StartsWith(consistency, "ssp:")) {
      Clock s = 0;
      if (!absl::SimpleAtoi(consistency.substr(4), &s) || s < 0) {
        return absl::InvalidArgumentError(
            absl::StrCat("table consistency '", consistency, "'"));
      }
      p.kind = ConsistencyPolicy::Kind::kSsp;
      p.staleness = s;
    } else if (!consistency.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("table consistency '", consistency, "'"));
    }
    return Wait(clock, p, consistency.empty() ? kNoTable : table, timeout);
  }

  // Waits as `policy` bounds a worker at `clock` (the scheduler applies
  // table `table`'s own policy, or the job's for kNoTable).
  absl::StatusOr<Clock> Wait(Clock clock, const ConsistencyPolicy& policy,
                             TableId table, absl::Duration timeout) {
    // Without backups the gating clock is the minimum of all clocks: ours
    // (queued, our pushes acknowledged) and the others', of which the
    // reporter keeps a lower bound. If that already lets this clock
    // proceed, the scheduler would answer at once: do not ask.
    const Clock known =
        std::min(reporter_->own_clock(), reporter_->others_lower_bound());
    if (policy.is_asp() ||
        (policy.backup_workers == 0 && policy.Allows(clock, known))) {
      return known;
    }
    DP_ASSIGN_OR_RETURN(Clock gating,
                        RetryThroughOutage(
                            [&](absl::Duration left) {
                              return scheduler_.WaitClock(id_, rank_, clock,
                                                          left, table);
                            },
                            timeout),
                        "worker ", rank_, " at clock ", clock);
    reporter_->ObserveGating(gating);
    return gating;
  }

  absl::StatusOr<EpochShare> EpochShareOf(int64_t epoch,
                                          absl::Duration timeout) override {
    DP_ASSIGN_OR_RETURN(std::vector<int> ranks,
                        RetryThroughOutage(
                            [&](absl::Duration) {
                              return scheduler_.EpochSplit(id_, rank_, epoch);
                            },
                            timeout),
                        "worker ", rank_, " epoch ", epoch);
    EpochShare share;
    share.count = static_cast<int>(ranks.size());
    const auto it = std::find(ranks.begin(), ranks.end(), rank_);
    if (it != ranks.end()) {
      share.index = static_cast<int>(it - ranks.begin());
    } else {
      share.count = 0;
    }
    return share;
  }

  absl::Status Barrier(const std::string& name,
                       absl::Duration timeout) override {
    return RetryThroughOutage(
        [&](absl::Duration left) {
          return scheduler_.Barrier(
              name, id_, static_cast<uint32_t>(policy_.total_workers()), left);
        },
        timeout);
  }

 private:
  absl::Status LeaveAs(bool finished, bool retire, const std::string& reason,
                       absl::Duration timeout) {
    // The last clock report first: a replacement starts from it.
    absl::Status flushed = reporter_->Flush(timeout);
    if (!flushed.ok()) DP_LOG(WARNING) << "before leaving: " << flushed;
    StopHeartbeats();
    ReleaseName();
    // Through a scheduler outage too: a leave it never hears of makes the
    // job wait the full --dead_after_ms for this worker.
    DP_RETURN_IF_ERROR(RetryThroughOutage(
        [&](absl::Duration) {
          return scheduler_.Leave(id_, finished, reason, retire);
        },
        timeout));
    return flushed;
  }

  // Keeps the worker alive in the scheduler's eyes while it computes or
  // waits on a slow peer; learns of a failed job (kAborted), which the
  // worker may be too busy on the data plane to hear of otherwise.
  void HeartbeatLoop(absl::Duration interval) ABSL_LOCKS_EXCLUDED(hb_mu_) {
    for (;;) {
      {
        absl::MutexLock lock(&hb_mu_);
        if (hb_mu_.AwaitWithTimeout(absl::Condition(&stop_heartbeats_),
                                    interval)) {
          return;
        }
      }
      auto hb = scheduler_.Heartbeat(id_, 0);
      if (hb.ok()) {
        if (hb->leave_for_good() && !asked_to_leave_.exchange(true)) {
          DP_LOG(INFO) << "the operator asked rank " << rank_
                       << " to leave the job for good (retire)";
          if (options_.on_asked_to_leave) options_.on_asked_to_leave();
        }
        continue;
      }
      if (hb.status().code() != absl::StatusCode::kAborted) {
        DP_LOG(WARNING) << hb.status();
        continue;
      }
      DP_LOG(ERROR) << hb.status();
      if (options_.on_job_failed) options_.on_job_failed(hb.status());
      return;
    }
  }
  // Names are unique per job (per scheduler), not per process.
  std::string LiveNameKey() const {
    return absl::StrCat(options_.scheduler_address, "/", options_.name);
  }
  void ReleaseName() ABSL_LOCKS_EXCLUDED(hb_mu_) {
    absl::MutexLock lock(&hb_mu_);
    if (holds_name_) LiveNames().Release(LiveNameKey());
    holds_name_ = false;
  }
  void StopHeartbeats() ABSL_LOCKS_EXCLUDED(hb_mu_) {
    {
      absl::MutexLock lock(&hb_mu_);
      stop_heartbeats_ = true;
    }
    absl::MutexLock lock(&join_mu_);
    if (heartbeat_.joinable()) heartbeat_.join();
  }

  const JobMemberOptions options_;
  SchedulerClient scheduler_;
  NodeId id_ = kNoNode;
  int rank_ = 0;
  Clock start_clock_ = 0;
  Clock first_clock_ = 0;
  ConsistencyPolicy policy_;
  uint64_t restored_from_ = 0;
  absl::flat_hash_set<std::string> passed_barriers_;  // set by Join
  absl::Mutex hb_mu_;
  bool stop_heartbeats_ ABSL_GUARDED_BY(hb_mu_) = false;
  bool holds_name_ ABSL_GUARDED_BY(hb_mu_) = false;  // in LiveNames()
  std::atomic<bool> asked_to_leave_{false};  // set by the heartbeat thread
  absl::Mutex join_mu_;  // one joiner at a time (Leave, the destructor)
  std::thread heartbeat_;
  std::unique_ptr<ClockReporter> reporter_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<JobMember>> JobMember::Join(
    const JobMemberOptions& options) {
  if (options.scheduler_address.empty()) {
    return absl::InvalidArgumentError("join a job: no scheduler address");
  }
  auto member = std::make_unique<JobMemberImpl>(options);
  DP_RETURN_IF_ERROR(member->Init(), "join the job as '", options.name, "'");
  return std::unique_ptr<JobMember>(std::move(member));
}

}  // namespace downpour
