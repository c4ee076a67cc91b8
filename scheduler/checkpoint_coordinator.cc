#include "scheduler/checkpoint_coordinator.h"

#include <algorithm>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "cluster/server_admin_client.h"
#include "common/error_reason.h"
#include "common/logging.h"
#include "common/status_macros.h"
#include "scheduler/state_store.h"

namespace downpour {

CheckpointCoordinator::CheckpointCoordinator(const CheckpointOptions& options,
                                             proto::ClusterMap* map,
                                             const Membership* members,
                                             TableRegistry* tables, Job* job,
                                             DurableState* durable)
    : options_(options),
      map_(map),
      members_(members),
      tables_(tables),
      job_(job),
      durable_(durable),
      admins_(options.auth) {}

const proto::CheckpointManifest* CheckpointCoordinator::FindManifest(
    uint64_t id) const {
  for (const auto& m : manifests_) {
    if (m.id() == id) return &m;
  }
  return nullptr;
}

std::vector<CheckpointServer> CheckpointCoordinator::LiveServers() const {
  std::vector<CheckpointServer> out;
  for (const proto::NodeInfo* n : members_->AliveServers()) {
    out.push_back({n->id(), n->name(), n->admin_address()});
  }
  return out;
}

std::string CheckpointCoordinator::WorkersHeldBack() const {
  if (restoring_ != 0) {
    const proto::CheckpointManifest* m = FindManifest(restoring_);
    std::string missing;
    if (m != nullptr) {
      for (const std::string& name : ServersOf(*m)) {
        const proto::NodeInfo* n = members_->FindByName(name, proto::SERVER);
        if (n == nullptr || n->state() != proto::ALIVE) {
          absl::StrAppend(&missing, missing.empty() ? "" : ", ", "'", name,
                          "'");
        }
      }
    }
    return absl::StrCat(
        "the job is being restored from checkpoint ", restoring_,
        m != nullptr ? absl::StrCat(" (clock ", m->clock(), ")") : "",
        missing.empty() ? "" : absl::StrCat("; waiting for servers ", missing));
  }
  if (!manifests_.empty() && members_->unconfirmed() > 0) {
    return absl::StrCat("the scheduler restarted and waits to hear from ",
                        members_->unconfirmed(),
                        " servers (at most --dead_after_ms)");
  }
  return "";
}

void CheckpointCoordinator::DataLost(const proto::NodeInfo& server) {
  if (!manifests_.empty() && restoring_ == 0) {
    // Its data is gone and no other server holds it: the job goes back
    // to the newest checkpoint (Run).
    restoring_ = manifests_.back().id();
    DP_LOG(WARNING) << "server '" << server.name() << "' (id " << server.id()
                    << ") restarted without the data of "
                    << "ranges only it held: the job rolls back to "
                    << "checkpoint " << restoring_ << " (clock "
                    << manifests_.back().clock() << ")";
  } else if (restoring_ == 0) {
    DP_LOG(WARNING) << "server '" << server.name() << "' (id " << server.id()
                    << ") restarted: ranges only it held are lost";
  }
}

absl::StatusOr<proto::CheckpointManifest> CheckpointCoordinator::Checkpoint(
    SchedulerMutex& lock, absl::Duration timeout,
    const proto::LbfgsState& lbfgs) {
  if (!durable_->persistent()) {
    return absl::FailedPreconditionError(
        "checkpoints need the scheduler's --state_dir (the manifests live "
        "there)");
  }
  auto waiter = std::make_shared<Waiter>();
  waiter->lbfgs = lbfgs;
  if (lock.stopped) return absl::UnavailableError("scheduler stopped");
  requests_.push_back(waiter);
  auto done = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(lock.mu) {
    return waiter->done || lock.stopped;
  };
  if (!lock.mu.AwaitWithTimeout(absl::Condition(&done), timeout)) {
    return absl::DeadlineExceededError(
        absl::StrCat("checkpoint not complete after ",
                     absl::FormatDuration(timeout), " (it goes on)"));
  }
  if (!waiter->done) return absl::UnavailableError("scheduler stopped");
  return waiter->result;
}

absl::StatusOr<proto::CheckpointManifest> CheckpointCoordinator::Restore(
    SchedulerMutex& lock, uint64_t id, absl::Duration timeout) {
  if (!durable_->persistent()) {
    return absl::FailedPreconditionError(
        "restore: checkpoints need the scheduler's --state_dir (the "
        "manifests live there)");
  }
  if (FindManifest(id) == nullptr) {
    std::vector<uint64_t> kept;
    for (const auto& m : manifests_) kept.push_back(m.id());
    return absl::NotFoundError(absl::StrCat(
        "restore: no complete checkpoint ", id, " (",
        kept.empty()
            ? "there is none"
            : absl::StrCat("the scheduler keeps ", absl::StrJoin(kept, ", ")),
        ")"));
  }
  if (restoring_ != 0) {
    return WithReason(
        absl::FailedPreconditionError(absl::StrCat(
            "restore of checkpoint ", id, ": the restore of checkpoint ",
            restoring_, " is under way")),
        ErrorReason::kRestoreUnderWay);
  }
  const uint64_t completed_before = restores_completed_;
  restoring_ = id;
  restore_epoch_ = 0;
  DP_LOG(WARNING) << "operator: the job rolls back to checkpoint " << id
                  << " (clock " << FindManifest(id)->clock() << ")";
  // The restore runs from here whether or not its record reaches the
  // disk (Run may already have started it); a scheduler restarted without
  // the record does not finish it.
  if (absl::Status s = durable_->AwaitDurable(lock, durable_->Commit());
      !s.ok()) {
    DP_LOG(ERROR) << "restore of checkpoint " << id << ": " << s;
  }
  auto done = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(lock.mu) {
    return lock.stopping || restoring_ == 0;
  };
  if (!lock.mu.AwaitWithTimeout(absl::Condition(&done), timeout)) {
    return absl::DeadlineExceededError(absl::StrCat(
        "restore of checkpoint ", id, " not complete after ",
        absl::FormatDuration(timeout),
        " (it goes on; the scheduler's log says what it waits for)"));
  }
  if (lock.stopping) return absl::UnavailableError("scheduler stopping");
  if (restores_completed_ == completed_before || restored_from_ != id) {
    return absl::AbortedError(absl::StrCat(
        "restore of checkpoint ", id, " failed",
        restores_completed_ > completed_before
            ? absl::StrCat("; the job went back to the older checkpoint ",
                           restored_from_, " instead")
            : "; see the scheduler's log"));
  }
  return *FindManifest(id);
}

void CheckpointCoordinator::Run(SchedulerMutex& lock) {
  const absl::Duration every = options_.every;
  absl::Time next_periodic = every > absl::ZeroDuration()
                                 ? absl::Now() + every
                                 : absl::InfiniteFuture();
  absl::Time not_before = absl::InfinitePast();
  while (!lock.stopping) {
    auto work = [this, &lock]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(lock.mu) {
      return lock.stopping || restoring_ != 0 || !requests_.empty();
    };
    lock.mu.AwaitWithTimeout(absl::Condition(&work), absl::Milliseconds(100));
    if (lock.stopping) break;
    if (restoring_ != 0) {
      RunRestore(lock);
      continue;
    }
    const absl::Time now = absl::Now();
    bool due = !requests_.empty();
    if (!due && now >= not_before && map_->tables_size() > 0 &&
        WorkersHeldBack().empty()) {
      due = now >= next_periodic ||
            (options_.every_clocks > 0 &&
             job_->GatingClock() >=
                 last_checkpoint_clock_ + options_.every_clocks);
    }
    if (!due) continue;
    std::deque<std::shared_ptr<Waiter>> waiting;
    waiting.swap(requests_);
    // One coordinator per job: the newest state asked for, if any.
    proto::LbfgsState lbfgs;
    for (const auto& w : waiting) {
      if (!w->lbfgs.table().empty()) lbfgs = w->lbfgs;
    }
    absl::StatusOr<proto::CheckpointManifest> result =
        TakeCheckpoint(lock, lbfgs);
    for (auto& w : waiting) {
      w->result = result;
      w->done = true;
    }
    if (!result.ok()) {
      DP_LOG(WARNING) << "checkpoint failed: " << result.status();
      not_before = absl::Now() + absl::Seconds(5);
    }
    if (every > absl::ZeroDuration()) next_periodic = absl::Now() + every;
  }
  for (auto& w : requests_) {
    w->result = absl::UnavailableError("scheduler shutting down");
    w->done = true;
  }
  requests_.clear();
}

absl::StatusOr<proto::CheckpointManifest> CheckpointCoordinator::TakeCheckpoint(
    SchedulerMutex& lock, const proto::LbfgsState& lbfgs) {
  StateStore* const store = durable_->store();
  const absl::Time start = absl::Now();
  const absl::Time deadline = start + options_.timeout;
  absl::Status last = absl::DeadlineExceededError("no attempt");
  for (int attempt = 0; attempt < 8 && absl::Now() < deadline; ++attempt) {
    if (lock.stopping) return absl::UnavailableError("scheduler shutting down");
    if (restoring_ != 0) {
      return absl::FailedPreconditionError(absl::StrCat(
          "a restore from checkpoint ", restoring_, " is running"));
    }
    CheckpointPlan plan;
    // The id is on disk before any server writes under it.
    plan.id = next_checkpoint_id_++;
    DP_RETURN_IF_ERROR(durable_->AwaitDurable(lock, durable_->Commit()),
                       "checkpoint");
    plan.servers = LiveServers();
    for (const auto& t : map_->tables()) plan.tables.push_back(t.spec());
    plan.bsp = options_.bsp;
    // After a part passed the cut, the job is moving: wait for its step.
    plan.clock_offset = attempt > 0 ? 1 : 0;
    plan.deadline = deadline;
    plan.auth = options_.auth;
    // Clocks before the cut: every update below them is in it.
    const proto::SchedulerClocks clocks = job_->ClocksSnapshot();
    const int64_t gating = job_->GatingClock();
    const proto::JobConfig config = job_->config();
    lock.mu.Unlock();
    absl::StatusOr<proto::CheckpointManifest> m = RunCheckpoint(plan, &admins_);
    absl::Status saved = m.status();
    if (m.ok()) {
      *m->mutable_job() = config;
      const bool at_clock = m->clock() >= 0;
      if (!at_clock) m->set_clock(gating);
      for (proto::WorkerStatus w : clocks.workers()) {
        // Under BSP every worker resumes at the cut's clock.
        if (at_clock) w.set_clock(m->clock());
        *m->add_workers() = w;
      }
      if (!lbfgs.table().empty()) *m->mutable_lbfgs() = lbfgs;
      m->set_time_unix_ms(absl::ToUnixMillis(absl::Now()));
      m->set_duration_ms(absl::ToInt64Milliseconds(absl::Now() - start));
      saved = store->SaveManifest(*m);
    }
    lock.mu.Lock();
    if (saved.ok()) {
      manifests_.push_back(*m);
      last_checkpoint_clock_ = m->clock();
      std::vector<uint64_t> old;
      const size_t keep = std::max(1, options_.keep);
      while (manifests_.size() > keep) {
        old.push_back(manifests_.front().id());
        manifests_.erase(manifests_.begin());
      }
      proto::DropCheckpointsRequest drop;
      drop.set_keep_from(manifests_.front().id());
      drop.set_completed(m->id());
      const std::vector<CheckpointServer> servers = LiveServers();
      lock.mu.Unlock();
      for (uint64_t id : old) {
        absl::Status s = store->DeleteManifest(id);
        if (!s.ok()) DP_LOG(WARNING) << s;
      }
      DropCheckpoints(servers, drop, &admins_);
      lock.mu.Lock();
      DP_LOG(INFO) << "checkpoint " << m->id() << " complete: clock "
                   << m->clock() << ", " << m->tables_size() << " tables, "
                   << m->rows() << " rows, " << m->bytes() << " bytes in "
                   << m->duration_ms() << " ms";
      return *m;
    }
    last = saved;
    proto::DropCheckpointsRequest drop;
    drop.add_drop(plan.id);
    lock.mu.Unlock();
    DropCheckpoints(plan.servers, drop, &admins_);
    lock.mu.Lock();
    if (last.code() != absl::StatusCode::kAborted) return last;
    DP_LOG(INFO) << "checkpoint " << plan.id << ": " << last
                 << "; trying again";
  }
  return last;
}

void CheckpointCoordinator::RunRestore(SchedulerMutex& lock) {
  const uint64_t id = restoring_;
  const proto::CheckpointManifest* found = FindManifest(id);
  if (found == nullptr) {
    DP_LOG(ERROR) << "restore: checkpoint " << id << " has no manifest";
    restoring_ = 0;
    durable_->Commit();
    return;
  }
  const proto::CheckpointManifest m = *found;
  const std::vector<std::string> names = ServersOf(m);
  // 1. Every server the checkpoint names, registered.
  auto all_alive = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(lock.mu) {
    if (lock.stopping) return true;
    for (const std::string& name : names) {
      const proto::NodeInfo* n = members_->FindByName(name, proto::SERVER);
      if (n == nullptr || n->state() != proto::ALIVE) return false;
    }
    return true;
  };
  while (!lock.mu.AwaitWithTimeout(absl::Condition(&all_alive),
                                   options_.restore_wait)) {
    DP_LOG(WARNING) << "restore of checkpoint " << id << ": "
                    << WorkersHeldBack()
                    << " (a checkpoint restores only onto the servers "
                    << "whose data dirs hold it, by name)";
  }
  if (lock.stopping) return;
  // 2. The checkpoint's tables and ranges, each on the server holding
  // its rows, lost until loaded.
  if (restore_epoch_ == 0) {
    tables_->LoadCheckpoint(m);
    map_->set_epoch(map_->epoch() + 1);
    restore_epoch_ = map_->epoch();
    DP_LOG(INFO) << "restore of checkpoint " << id << " (clock " << m.clock()
                 << ") over " << names.size() << " servers, epoch "
                 << restore_epoch_;
    // Tried again next round if it cannot be written.
    if (!durable_->AwaitDurable(lock, durable_->Commit()).ok()) return;
  }
  // 3. Each server loads its ranges, in parallel.
  std::vector<absl::Status> results(names.size());
  std::vector<uint64_t> loaded_incarnation(names.size(), 0);
  lock.mu.Unlock();
  std::vector<std::thread> threads;
  for (size_t i = 0; i < names.size(); ++i) {
    threads.emplace_back([&, i] {
      results[i] = RestoreServer(lock, m, names[i], &loaded_incarnation[i]);
    });
  }
  for (auto& t : threads) t.join();
  lock.mu.Lock();
  if (lock.stopping) return;
  for (size_t i = 0; i < names.size(); ++i) {
    const proto::NodeInfo* n = members_->FindByName(names[i], proto::SERVER);
    if (results[i].ok() &&
        (n == nullptr || n->incarnation() != loaded_incarnation[i])) {
      // It restarted after loading: what it loaded is gone. Again.
      DP_LOG(WARNING) << "restore of checkpoint " << id << ": server '"
                      << names[i] << "' restarted meanwhile; again";
      return;
    }
    if (results[i].ok()) continue;
    DP_LOG(ERROR) << "restore of checkpoint " << id
                  << " failed: " << results[i];
    const proto::CheckpointManifest* older = nullptr;
    for (const auto& other : manifests_) {
      if (other.id() < id) older = &other;
    }
    restoring_ = older != nullptr ? older->id() : 0;
    restore_epoch_ = 0;
    if (older != nullptr) {
      DP_LOG(WARNING) << "trying the older checkpoint " << restoring_;
    } else {
      DP_LOG(ERROR) << "no older checkpoint: the lost ranges stay lost";
    }
    durable_->Commit();
    return;
  }
  // 4. Serve them again, at the checkpoint's clocks.
  tables_->ServeRestored();
  job_->SetClocks(m);
  // Workers still running belong to the job before the rollback: they
  // must register again, and get the checkpoint's clock.
  for (const auto& n : map_->nodes()) {
    if (n.role() == proto::WORKER) rolled_back_.insert(n.id());
  }
  restored_from_ = id;
  ++restores_completed_;
  restored_clock_ = m.clock();
  last_checkpoint_clock_ = m.clock();
  restoring_ = 0;
  restore_epoch_ = 0;
  map_->set_epoch(map_->epoch() + 1);
  DP_LOG(INFO) << "restored checkpoint " << id << ": the job resumes at "
               << "clock " << m.clock() << ", epoch " << map_->epoch();
  durable_->AwaitDurable(lock, durable_->Commit()).IgnoreError();
}

absl::Status CheckpointCoordinator::RestoreServer(
    SchedulerMutex& lock, const proto::CheckpointManifest& m,
    const std::string& name, uint64_t* incarnation) {
  proto::RestoreRequest req;
  req.set_checkpoint_id(m.id());
  for (const auto& r : RangesOf(m, name)) *req.add_ranges() = r;
  const absl::Duration timeout = std::max(absl::Minutes(10), options_.timeout);
  req.set_timeout_ms(absl::ToInt64Milliseconds(timeout));
  while (true) {
    std::string address;
    {
      absl::MutexLock l(&lock.mu);
      auto ready = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(lock.mu) {
        if (lock.stopping) return true;
        const proto::NodeInfo* n = members_->FindByName(name, proto::SERVER);
        return n != nullptr && n->state() == proto::ALIVE &&
               members_->applied(n->id()) >= restore_epoch_;
      };
      lock.mu.AwaitWithTimeout(absl::Condition(&ready), absl::Seconds(1));
      if (lock.stopping) return absl::UnavailableError("scheduler stopping");
      if (!ready()) continue;
      const proto::NodeInfo* n = members_->FindByName(name, proto::SERVER);
      address = n->admin_address();
      *incarnation = n->incarnation();
    }
    absl::StatusOr<proto::RestoreReply> r =
        admins_.Get(address)->Restore(req, timeout);
    if (r.ok()) {
      DP_LOG(INFO) << "server '" << name << "' loaded " << r->ranges()
                   << " ranges (" << r->rows() << " rows, " << r->bytes()
                   << " bytes) of checkpoint " << m.id() << " in "
                   << r->duration_ms() << " ms";
      return absl::OkStatus();
    }
    const absl::StatusCode code = r.status().code();
    // Down, restarting or still applying the map: ask again.
    if (code == absl::StatusCode::kUnavailable ||
        code == absl::StatusCode::kDeadlineExceeded ||
        code == absl::StatusCode::kFailedPrecondition) {
      DP_LOG(INFO) << "restore: server '" << name << "': " << r.status()
                   << "; asking again";
      absl::SleepFor(absl::Milliseconds(200));
      continue;
    }
    return Annotate(r.status(), absl::StrCat("server '", name, "'"));
  }
}

void CheckpointCoordinator::Export(proto::SchedulerState* state) const {
  state->set_next_checkpoint_id(next_checkpoint_id_);
  state->set_restoring(restoring_);
  state->set_restored_from(restored_from_);
  state->set_restored_clock(restored_clock_);
  for (NodeId id : rolled_back_) state->add_rolled_back_workers(id);
}

void CheckpointCoordinator::Import(
    const proto::SchedulerState& state,
    std::vector<proto::CheckpointManifest> manifests) {
  next_checkpoint_id_ = std::max<uint64_t>(1, state.next_checkpoint_id());
  restoring_ = state.restoring();
  restored_from_ = state.restored_from();
  restored_clock_ = state.restored_clock();
  rolled_back_.insert(state.rolled_back_workers().begin(),
                      state.rolled_back_workers().end());
  manifests_ = std::move(manifests);
  if (!manifests_.empty()) last_checkpoint_clock_ = manifests_.back().clock();
}

}  // namespace downpour
