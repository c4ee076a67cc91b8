// The scheduler's gRPC face. Each handler checks its request
// (request_checks.h), takes the one mutex (lock_.mu), delegates to the
// parts that hold the state, and waits, releasing the mutex, where the call
// waits. The parts, one job each, all guarded by lock_.mu:
//   membership_   nodes, ids, heartbeats, the failure sweep's decisions
//   tables_       tables: declaration, refusals, ranges' holders, handovers
//   job_          ranks, the lost-worker rule, clocks
//   barriers_     named barriers and those the job passed
//   durable_      versions, the persister, the published map
//   checkpoints_  checkpoints, restores, the durability loop
//   lifecycle_    what a node's arrival, departure and death mean for them
// The map (map_) is owned here and lent to the parts. Dependencies point
// one way: lifecycle_ -> checkpoints_ -> tables_ -> membership_, barriers_
// -> job_ -> membership_, and every part -> durable_.
#include "scheduler/scheduler.h"

#include <algorithm>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/grpc_server.h"
#include "common/grpc_status.h"
#include "common/logging.h"
#include "common/status_macros.h"
#include "common/types.h"
#include "grpcpp/grpcpp.h"
#include "proto/downpour.grpc.pb.h"
#include "scheduler/barriers.h"
#include "scheduler/checkpoint_coordinator.h"
#include "scheduler/durable_state.h"
#include "scheduler/job.h"
#include "scheduler/job_metrics.h"
#include "scheduler/membership.h"
#include "scheduler/node_lifecycle.h"
#include "scheduler/request_checks.h"
#include "scheduler/scheduler_mutex.h"
#include "scheduler/state_store.h"
#include "scheduler/table_registry.h"

namespace downpour {
namespace {

// For this long after a recovery from --state_dir, a clock report ahead of
// the others' record waits up to kRecoveryGrace (bounded by the caller's
// deadline) instead of --clock_report_grace_ms: see AdvanceClock.
constexpr absl::Duration kRecoveryWindow = absl::Seconds(60);
constexpr absl::Duration kRecoveryGrace = absl::Seconds(30);

// Each part's share of the options.
MembershipOptions MembershipOptionsOf(const SchedulerOptions& o) {
  MembershipOptions m{o.dead_after, o.suspect_grace, o.forget_dead_after,
                      o.max_nodes, o.max_map_bytes};
  // SweepLoop sweeps every 50 ms at most: four missed sweeps, or a
  // heartbeat interval, whichever is longer, is a stall.
  m.sweep_stall = std::max(o.heartbeat_interval, absl::Milliseconds(200));
  return m;
}
JobOptions JobOptionsOf(const SchedulerOptions& o) {
  return {o.policy, o.worker_loss, o.clock_report_slack};
}
TableRegistryOptions TableOptionsOf(const SchedulerOptions& o) {
  TableRegistryOptions t;
  t.replicas = o.replicas;
  t.balance_primaries = o.balance_primaries;
  t.handover_timeout = o.handover_timeout;
  t.min_servers = o.min_servers;
  t.max_map_bytes = o.max_map_bytes;
  t.min_ranges = o.ranges_per_table;
  t.rebalance = o.rebalance;
  t.max_moves = std::max(1, o.max_range_moves);
  t.balance_by = o.balance_load ? MoveOptions::Balance::kLoad
                                : MoveOptions::Balance::kBytes;
  t.split_hot_ranges = o.split_hot_ranges;
  t.merge_cold_ranges = o.merge_cold_ranges;
  t.merge_min_age = o.merge_min_age;
  return t;
}
CheckpointOptions CheckpointOptionsOf(const SchedulerOptions& o) {
  return {o.checkpoint_every_clocks,
          o.checkpoint_every,
          o.checkpoint_timeout,
          o.keep_checkpoints,
          o.restore_wait,
          o.policy.kind == ConsistencyPolicy::Kind::kBsp,
          o.auth};
}

grpc::Status Err(const absl::Status& s) { return ToGrpcStatus(s); }

// What is left of a call's deadline (long when it has none).
absl::Duration TimeLeft(const grpc::ServerContext* ctx) {
  const absl::Time deadline = absl::FromChrono(ctx->deadline());
  return std::max(absl::ZeroDuration(), deadline - absl::Now());
}

class SchedulerImpl final : public Scheduler,
                            public proto::Scheduler::Service,
                            private DurableState::Source {
 public:
  explicit SchedulerImpl(const SchedulerOptions& o)
      : options_(o),
        durable_(&map_, this),
        membership_(MembershipOptionsOf(o), &map_),
        job_(JobOptionsOf(o), &map_, &membership_, &durable_),
        barriers_(o.max_nodes, &job_, &durable_),
        tables_(TableOptionsOf(o), &map_, &membership_, &durable_),
        checkpoints_(CheckpointOptionsOf(o), &map_, &membership_, &tables_,
                     &job_, &durable_),
        lifecycle_(o.heartbeat_interval, &map_, &membership_, &job_, &barriers_,
                   &tables_, &checkpoints_, &durable_) {}
  ~SchedulerImpl() override { Shutdown(); }

  absl::Status Start() ABSL_LOCKS_EXCLUDED(lock_.mu) {
    if (!options_.state_dir.empty()) DP_RETURN_IF_ERROR(Recover());
    DP_ASSIGN_OR_RETURN(StartedGrpcServer started,
                        StartGrpcServer(options_.listen_address, this,
                                        "the scheduler", options_.auth));
    health_ = std::move(started.health);
    server_ = std::move(started.server);
    port_ = started.port;
    sweeper_ = std::thread([this] { SweepLoop(); });
    if (!options_.state_dir.empty()) {
      persister_ = std::thread([this] {
        absl::MutexLock lock(&lock_.mu);
        durable_.PersistLoop(lock_);
      });
      durability_ = std::thread([this] {
        absl::MutexLock lock(&lock_.mu);
        checkpoints_.Run(lock_);
      });
    }
    if (options_.metrics != nullptr) {
      metrics_ = options_.metrics->Add([this](MetricWriter* w) {
        proto::ClusterMap map;
        proto::JobStatus job;
        SchedulerEvents events;
        {
          absl::MutexLock lock(&lock_.mu);
          map = map_;
          job_.FillJobStatus(&job);
          events.servers_declared_dead = membership_.servers_declared_dead();
          events.workers_declared_dead = membership_.workers_declared_dead();
          events.promotions = tables_.promotions();
          events.ranges_lost = tables_.ranges_lost();
          events.moves_started = tables_.moves_started();
          events.moves_done = tables_.moves_done();
          events.splits_started = tables_.splits_started();
          events.splits_done = tables_.splits_done();
          events.merges_started = tables_.merges_started();
          events.merges_done = tables_.merges_done();
        }
        WriteSchedulerMetrics(map, job, events, w);
      });
    }
    DP_LOG(INFO) << "scheduler listening on port " << port_;
    return absl::OkStatus();
  }

  int port() const override { return port_; }

  void Wait() override {
    absl::MutexLock lock(&lock_.mu);
    lock_.mu.Await(absl::Condition(&lock_.stopped));
  }

  void Shutdown() override {
    {
      absl::MutexLock lock(&lock_.mu);
      if (lock_.stopping) {
        // Another thread is shutting down: return once it has finished.
        lock_.mu.Await(absl::Condition(&lock_.stopped));
        return;
      }
      lock_.stopping = true;
    }
    metrics_.Reset();
    if (sweeper_.joinable()) sweeper_.join();
    if (durability_.joinable()) durability_.join();
    // Streams and barriers notice `stopping` within their wait slice.
    if (server_) {
      server_->Shutdown(std::chrono::system_clock::now() +
                        std::chrono::seconds(2));
    }
    // The last changes reach the disk before Wait() returns.
    if (persister_.joinable()) persister_.join();
    absl::MutexLock lock(&lock_.mu);
    lock_.stopped = true;
  }

  proto::ClusterMap CurrentMap() const override {
    absl::MutexLock lock(&lock_.mu);
    return durable_.published();
  }

  void StopMoving() override {
    absl::MutexLock lock(&lock_.mu);
    if (tables_.StopMoving()) {
      map_.set_epoch(map_.epoch() + 1);
      (void)durable_.AwaitDurable(lock_, durable_.Commit());
    }
  }

  absl::StatusOr<proto::CheckpointManifest> Checkpoint(
      absl::Duration timeout, const proto::LbfgsState& lbfgs) override {
    absl::MutexLock lock(&lock_.mu);
    return checkpoints_.Checkpoint(lock_, timeout, lbfgs);
  }

  // --- gRPC service ---

  grpc::Status Register(grpc::ServerContext* ctx,
                        const proto::RegisterRequest* req,
                        proto::RegisterReply* reply) override {
    if (absl::Status s = CheckRegisterRequest(*req); !s.ok()) return Err(s);
    if (req->role() == proto::WORKER && !options_.job_token.empty() &&
        !TokensMatch(req->job_token(), options_.job_token)) {
      return Err(absl::PermissionDeniedError(absl::StrCat(
          "register worker '", req->name(), "': ",
          req->job_token().empty() ? "no job token" : "a wrong job token",
          "; worker ranks go only to the job's workers (ps_worker "
          "--job_token_file, the file given to ps_scheduler)")));
    }
    absl::MutexLock lock(&lock_.mu);
    return Err(lifecycle_.Register(lock_, *req, reply));
  }

  grpc::Status Heartbeat(grpc::ServerContext* ctx,
                         const proto::HeartbeatRequest* req,
                         proto::HeartbeatReply* reply) override {
    absl::MutexLock lock(&lock_.mu);
    proto::NodeInfo* node = membership_.Find(req->node_id());
    if (node == nullptr) {
      return Err(
          absl::NotFoundError(absl::StrCat("unknown node ", req->node_id())));
    }
    if (node->state() == proto::DEAD || node->state() == proto::LEFT) {
      return Err(absl::FailedPreconditionError(absl::StrCat(
          "node ", req->node_id(), " was declared dead; register again")));
    }
    // A failed job tells its workers through their heartbeats, even those
    // waiting on the data plane rather than on the scheduler.
    if (node->role() == proto::WORKER && !job_.failure().ok()) {
      return Err(job_.failure());
    }
    membership_.Heard(node->id(), absl::Now());
    membership_.RecordApplied(node->id(), req->applied_epoch());
    if (node->role() == proto::SERVER && req->ranges_size() > 0) {
      tables_.ReportRanges(node->id(), *req, absl::Now());
    }
    tables_.ResolvePending();
    reply->set_epoch(durable_.published().epoch());
    if (node->role() == proto::WORKER) {
      const int rank = job_.RankOf(node->id());
      if (rank >= 0 && job_.AskedToLeave(rank)) reply->set_leave_for_good(true);
    }
    return grpc::Status::OK;
  }

  grpc::Status RetireWorker(grpc::ServerContext* ctx,
                            const proto::RetireWorkerRequest* req,
                            proto::RetireWorkerReply* reply) override {
    absl::MutexLock lock(&lock_.mu);
    absl::StatusOr<proto::RetireWorkerReply> r = job_.Retire(req->rank());
    if (!r.ok()) return Err(r.status());
    *reply = *std::move(r);
    // A rank retired here is in the map (and on disk) before the answer.
    return Err(durable_.AwaitDurable(lock_, durable_.Commit()));
  }

  grpc::Status Leave(grpc::ServerContext* ctx, const proto::LeaveRequest* req,
                     proto::LeaveReply*) override {
    absl::MutexLock lock(&lock_.mu);
    return Err(lifecycle_.Leave(lock_, *req));
  }

  grpc::Status Drain(grpc::ServerContext* ctx, const proto::DrainRequest* req,
                     proto::DrainReply* reply) override {
    if (absl::Status s = CheckName("server name", req->name(),
                                   kMaxNodeNameBytes, /*may_be_empty=*/true);
        !s.ok()) {
      return Err(s);
    }
    absl::MutexLock lock(&lock_.mu);
    return Err(lifecycle_.Drain(lock_, *req, reply));
  }

  grpc::Status SplitRange(grpc::ServerContext* ctx,
                          const proto::SplitRangeRequest* req,
                          proto::SplitRangeReply* reply) override {
    if (absl::Status s = CheckName("table name", req->table(), kMaxNameBytes,
                                   /*may_be_empty=*/false);
        !s.ok()) {
      return Err(s);
    }
    absl::MutexLock lock(&lock_.mu);
    if (checkpoints_.restoring() != 0) {
      return Err(absl::UnavailableError(
          absl::StrCat(req->merge() ? "merge" : "split",
                       ": the job is being restored from checkpoint ",
                       checkpoints_.restoring(), "; retry once it is done")));
    }
    absl::StatusOr<proto::SplitRangeReply> r = tables_.Split(*req);
    if (!r.ok()) return Err(r.status());
    *reply = *std::move(r);
    // The split or merge is in the map (and on disk) before the answer.
    return Err(durable_.AwaitDurable(lock_, durable_.Commit()));
  }

  grpc::Status AckEpoch(grpc::ServerContext* ctx,
                        const proto::AckEpochRequest* req,
                        proto::AckEpochReply*) override {
    if (absl::Status s = CheckTableFailures(*req); !s.ok()) return Err(s);
    absl::MutexLock lock(&lock_.mu);
    if (membership_.Find(req->node_id()) == nullptr) {
      return Err(
          absl::NotFoundError(absl::StrCat("unknown node ", req->node_id())));
    }
    // Failures first: the epoch they come with must not count as applied
    // for a table this server could not create.
    for (const proto::TableFailure& f : req->failed_tables()) {
      tables_.TableFailed(req->node_id(), f);
    }
    membership_.RecordApplied(req->node_id(), req->epoch());
    tables_.ResolvePending();
    return grpc::Status::OK;
  }

  grpc::Status GetClusterMap(grpc::ServerContext* ctx,
                             const proto::GetClusterMapRequest*,
                             proto::ClusterMap* map) override {
    absl::MutexLock lock(&lock_.mu);
    *map = durable_.published();
    return grpc::Status::OK;
  }

  grpc::Status WatchClusterMap(
      grpc::ServerContext* ctx, const proto::WatchClusterMapRequest* req,
      grpc::ServerWriter<proto::ClusterMap>* writer) override {
    Epoch known = req->known_epoch();
    bool broken = false;
    while (!(broken = ctx->IsCancelled())) {
      proto::ClusterMap map;
      {
        absl::MutexLock lock(&lock_.mu);
        auto changed = [this, known]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(lock_.mu) {
          return lock_.stopping || durable_.published().epoch() > known;
        };
        // Short slices: a stream that breaks is how a killed node first
        // shows, and failover waits for it.
        lock_.mu.AwaitWithTimeout(absl::Condition(&changed),
                                  absl::Milliseconds(50));
        if (lock_.stopping) break;
        if (durable_.published().epoch() <= known) continue;
        map = durable_.published();
      }
      known = map.epoch();
      if (!writer->Write(map)) {  // not under the lock
        broken = true;
        break;
      }
    }
    if (broken && req->node_id() != kNoNode) {
      absl::MutexLock lock(&lock_.mu);
      if (!lock_.stopping) {
        membership_.Suspect(req->node_id(), "its map watch stream broke",
                            absl::Now());
      }
    }
    return grpc::Status::OK;
  }

  grpc::Status CreateTable(grpc::ServerContext* ctx,
                           const proto::CreateTableRequest* req,
                           proto::CreateTableReply* reply) override {
    if (absl::Status s = CheckTableStrings(req->spec()); !s.ok()) return Err(s);
    absl::StatusOr<absl::Duration> timeout =
        CheckWait("create table", req->timeout_ms(), absl::Seconds(10));
    if (!timeout.ok()) return Err(timeout.status());
    const absl::Time deadline = absl::Now() + *timeout;
    absl::StatusOr<proto::TableSpec> spec =
        SpecToDeclare(req->spec(), options_.policy);
    if (!spec.ok()) return Err(spec.status());
    absl::MutexLock lock(&lock_.mu);
    if (checkpoints_.restoring() != 0) {
      return Err(absl::UnavailableError(
          absl::StrCat("create table '", spec->name(),
                       "': the job is being restored from checkpoint ",
                       checkpoints_.restoring())));
    }
    return Err(tables_.Create(lock_, *spec, deadline, *timeout, reply));
  }

  grpc::Status AdvanceClock(grpc::ServerContext* ctx,
                            const proto::AdvanceClockRequest* req,
                            proto::AdvanceClockReply* reply) override {
    absl::MutexLock lock(&lock_.mu);
    // A failed job stays failed: its workers stop, whatever they report.
    if (!job_.failure().ok()) return Err(job_.failure());
    if (checkpoints_.restoring() != 0) {
      return Err(absl::UnavailableError(absl::StrCat(
          "advance clock: the job is being restored from checkpoint ",
          checkpoints_.restoring())));
    }
    if (checkpoints_.RolledBack(req->node_id())) {
      return Err(absl::FailedPreconditionError(absl::StrCat(
          "advance clock of worker ", req->rank(), " to ", req->clock(),
          ": the job was rolled back to checkpoint ",
          checkpoints_.restored_from(), " at clock ",
          checkpoints_.restored_clock(),
          "; this worker must register again (restart it) to resume there")));
    }
    if (absl::Status s =
            job_.CheckRankHolder("advance clock", req->node_id(), req->rank());
        !s.ok()) {
      return Err(s);
    }
    const int rank = req->rank();
    const Clock clock = req->clock();
    if (job_.BeyondBound(rank, clock)) {
      // Ahead of what the others reported: their reports may still be on
      // the way, so wait a little before refusing.
      auto within = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(lock_.mu) {
        return lock_.stopping || !job_.failure().ok() ||
               job_.WithinBound(rank, clock);
      };
      // Meanwhile the claim admits the others' reports that this one's
      // record would (ClockTable::Claim).
      job_.Claim(rank, clock);
      // Just after a recovery the recorded clocks lag by design (they are
      // written lazily; BSP workers went on through the servers), and the
      // workers come back one by one as their channels' reconnection
      // backoff allows (seconds apart): give the reports that time.
      absl::Duration grace = options_.clock_report_grace;
      if (absl::Now() - recovered_at_ < kRecoveryWindow) {
        grace = std::max(grace, kRecoveryGrace);
      }
      lock_.mu.AwaitWithTimeout(
          absl::Condition(&within),
          std::min(grace, TimeLeft(ctx) - absl::Milliseconds(100)));
      job_.Unclaim(rank, clock);
      if (lock_.stopping) {
        return Err(absl::UnavailableError("scheduler shutting down"));
      }
      // The job failed meanwhile: that, not the bound, is the answer.
      if (!job_.failure().ok()) return Err(job_.failure());
    }
    return Err(job_.Advance(*req, reply));
  }

  grpc::Status WaitClock(grpc::ServerContext* ctx,
                         const proto::WaitClockRequest* req,
                         proto::WaitClockReply* reply) override {
    absl::StatusOr<absl::Duration> timeout =
        CheckWait("wait clock", req->timeout_ms(), absl::Seconds(60));
    if (!timeout.ok()) return Err(timeout.status());
    absl::MutexLock lock(&lock_.mu);
    if (absl::Status s =
            job_.CheckRankHolder("wait clock", req->node_id(), req->rank());
        !s.ok()) {
      return Err(s);
    }
    // The job's policy, or the table's own (the hybrid: an SSP embedding
    // table waits for its bound, whatever the job's).
    ConsistencyPolicy policy = job_.policy();
    if (req->table_id() != 0) {
      const proto::TableMap* table = nullptr;
      for (const proto::TableMap& t : map_.tables()) {
        if (t.spec().id() == req->table_id()) table = &t;
      }
      if (table == nullptr) {
        return Err(absl::NotFoundError(absl::StrCat(
            "wait clock: table ", req->table_id(), " is not in the map")));
      }
      policy = policy.ForTable(table->spec());
    }
    auto may = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(lock_.mu) {
      return lock_.stopping || !job_.failure().ok() || policy.is_asp() ||
             policy.Allows(req->clock(), job_.GatingClock());
    };
    if (!lock_.mu.AwaitWithTimeout(absl::Condition(&may), *timeout)) {
      return Err(absl::DeadlineExceededError(
          absl::StrCat("worker ", req->rank(), " at clock ", req->clock(),
                       " still blocked by gating clock ", job_.GatingClock(),
                       " (", policy.ToString(), ")")));
    }
    if (lock_.stopping) {
      return Err(absl::UnavailableError("scheduler shutting down"));
    }
    if (!job_.failure().ok()) return Err(job_.failure());
    reply->set_gating_clock(job_.GatingClock());
    return grpc::Status::OK;
  }

  grpc::Status EpochSplit(grpc::ServerContext* ctx,
                          const proto::EpochSplitRequest* req,
                          proto::EpochSplitReply* reply) override {
    absl::MutexLock lock(&lock_.mu);
    if (absl::Status s =
            job_.CheckRankHolder("epoch split", req->node_id(), req->rank());
        !s.ok()) {
      return Err(s);
    }
    bool fixed_now = false;
    absl::StatusOr<std::vector<int>> ranks =
        job_.EpochSplit(req->epoch(), &fixed_now);
    if (!ranks.ok()) return Err(ranks.status());
    reply->set_epoch(req->epoch());
    reply->mutable_ranks()->Add(ranks->begin(), ranks->end());
    // On disk before anyone trains by it: a restarted scheduler answers
    // the same split.
    if (fixed_now) return Err(durable_.AwaitDurable(lock_, durable_.Commit()));
    return grpc::Status::OK;
  }

  grpc::Status GetJobStatus(grpc::ServerContext* ctx,
                            const proto::JobStatusRequest*,
                            proto::JobStatus* status) override {
    absl::MutexLock lock(&lock_.mu);
    job_.FillJobStatus(status);
    return grpc::Status::OK;
  }

  grpc::Status ReplicaReady(grpc::ServerContext* ctx,
                            const proto::ReplicaReadyRequest* req,
                            proto::ReplicaReadyReply*) override {
    absl::MutexLock lock(&lock_.mu);
    if (absl::Status s = tables_.ReplicaReady(*req); !s.ok()) return Err(s);
    // The primary reports once: it must not be forgotten by a restart.
    return Err(durable_.AwaitDurable(lock_, durable_.Commit()));
  }

  grpc::Status Checkpoint(grpc::ServerContext*,
                          const proto::CheckpointRequest* req,
                          proto::CheckpointReply* reply) override {
    const absl::Duration timeout =
        req->timeout_ms() > 0 ? absl::Milliseconds(req->timeout_ms())
                              : options_.checkpoint_timeout + absl::Seconds(5);
    if (absl::Status s = CheckLbfgsState(req->lbfgs()); !s.ok()) return Err(s);
    absl::StatusOr<proto::CheckpointManifest> m =
        Checkpoint(timeout, req->lbfgs());
    if (!m.ok()) return Err(m.status());
    *reply->mutable_manifest() = *std::move(m);
    return grpc::Status::OK;
  }

  grpc::Status ListCheckpoints(grpc::ServerContext*,
                               const proto::ListCheckpointsRequest*,
                               proto::ListCheckpointsReply* reply) override {
    absl::MutexLock lock(&lock_.mu);
    for (const auto& m : checkpoints_.manifests())
      *reply->add_checkpoints() = m;
    return grpc::Status::OK;
  }

  // The operator's rollback (psctl restore): the same restore as after a
  // lost range, of the checkpoint asked for.
  grpc::Status RestoreCheckpoint(
      grpc::ServerContext*, const proto::RestoreCheckpointRequest* req,
      proto::RestoreCheckpointReply* reply) override {
    absl::StatusOr<absl::Duration> timeout =
        CheckWait("restore", req->timeout_ms(), absl::Minutes(10));
    if (!timeout.ok()) return Err(timeout.status());
    absl::MutexLock lock(&lock_.mu);
    absl::StatusOr<proto::CheckpointManifest> m =
        checkpoints_.Restore(lock_, req->checkpoint_id(), *timeout);
    if (!m.ok()) return Err(m.status());
    *reply->mutable_manifest() = *std::move(m);
    reply->set_epoch(map_.epoch());
    return grpc::Status::OK;
  }

  grpc::Status ReportUnreachable(grpc::ServerContext* ctx,
                                 const proto::ReportUnreachableRequest* req,
                                 proto::ReportUnreachableReply*) override {
    absl::MutexLock lock(&lock_.mu);
    membership_.Suspect(req->suspect(),
                        absl::StrCat("node ", req->reporter(), ": ",
                                     Printable(req->reason(), 200)),
                        absl::Now());
    return grpc::Status::OK;
  }

  grpc::Status Barrier(grpc::ServerContext* ctx,
                       const proto::BarrierRequest* req,
                       proto::BarrierReply* reply) override {
    if (absl::Status s = CheckBarrierRequest(*req, options_.max_nodes);
        !s.ok()) {
      return Err(s);
    }
    absl::StatusOr<absl::Duration> timeout =
        CheckWait("barrier", req->timeout_ms(), absl::Seconds(60));
    if (!timeout.ok()) return Err(timeout.status());
    absl::MutexLock lock(&lock_.mu);
    // A barrier of all the job's workers (JobMember::Barrier) does not wait
    // for ranks the job goes on without.
    const proto::NodeInfo* caller = membership_.Find(req->node_id());
    const bool job_barrier = caller != nullptr &&
                             caller->role() == proto::WORKER &&
                             req->count() == static_cast<uint32_t>(job_.size());
    return Err(barriers_.Arrive(lock_, *req, job_barrier, *timeout, reply));
  }

 private:
  void SweepLoop() ABSL_LOCKS_EXCLUDED(lock_.mu) {
    // Often enough that a suspect's grace is not rounded up much.
    const absl::Duration slice =
        std::min(options_.heartbeat_interval / 2, absl::Milliseconds(50));
    absl::MutexLock lock(&lock_.mu);
    while (!lock_.stopping) {
      lock_.mu.AwaitWithTimeout(absl::Condition(&lock_.stopping), slice);
      if (lock_.stopping) break;
      lifecycle_.Sweep(absl::Now());
    }
  }

  // --- State on disk (DurableState::Source) ---

  proto::SchedulerState Snapshot() const override
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(lock_.mu) {
    proto::SchedulerState state;
    state.set_format(1);
    *state.mutable_map() = map_;
    state.set_next_node_id(membership_.next_node_id());
    job_.Export(&state);
    tables_.Export(&state);
    barriers_.Export(&state);
    checkpoints_.Export(&state);
    return state;
  }

  proto::SchedulerClocks ClocksSnapshot() const override
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(lock_.mu) {
    proto::SchedulerClocks clocks = job_.ClocksSnapshot();
    clocks.set_restored_from(checkpoints_.restored_from());
    return clocks;
  }

  // Opens the state dir and loads what a previous scheduler left there
  // into the parts.
  absl::Status Recover() ABSL_LOCKS_EXCLUDED(lock_.mu) {
    DP_ASSIGN_OR_RETURN(std::unique_ptr<StateStore> store,
                        StateStore::Open(options_.state_dir));
    DP_ASSIGN_OR_RETURN(std::optional<proto::SchedulerState> state,
                        store->LoadState());
    DP_ASSIGN_OR_RETURN(proto::SchedulerClocks clocks, store->LoadClocks());
    DP_ASSIGN_OR_RETURN(std::vector<proto::CheckpointManifest> manifests,
                        store->LoadManifests());
    absl::MutexLock lock(&lock_.mu);
    durable_.SetStore(std::move(store), options_.state_dir);
    // A new directory: the job is recorded at once, so that a restart
    // with other job flags is refused.
    if (!state.has_value()) return durable_.WriteFirst();
    DP_RETURN_IF_ERROR(job_.CheckSameJob(*state, options_.state_dir));
    map_ = state->map();
    // Every node gets a full dead_after to be heard from.
    membership_.Recovered(state->next_node_id(), absl::Now());
    tables_.Import(*state);
    barriers_.Import(*state);
    checkpoints_.Import(*state, std::move(manifests));
    const uint64_t restored_from = checkpoints_.restored_from();
    job_.Import(*state, clocks, restored_from,
                checkpoints_.FindManifest(restored_from));
    recovered_at_ = absl::Now();
    durable_.Recovered();
    const auto& kept = checkpoints_.manifests();
    DP_LOG(INFO) << "recovered state from " << options_.state_dir << ": epoch "
                 << map_.epoch() << ", " << map_.nodes_size() << " nodes, "
                 << map_.tables_size() << " tables, " << kept.size()
                 << " checkpoints"
                 << (kept.empty()
                         ? std::string()
                         : absl::StrCat(" (newest ", kept.back().id(),
                                        " at clock ", kept.back().clock(), ")"))
                 << ", gating clock " << job_.GatingClock()
                 << (checkpoints_.restoring() != 0
                         ? absl::StrCat("; resuming the restore of checkpoint ",
                                        checkpoints_.restoring())
                         : std::string());
    return absl::OkStatus();
  }

  const SchedulerOptions options_;
  int port_ = 0;
  std::unique_ptr<HealthService> health_;  // outlives server_
  std::unique_ptr<grpc::Server> server_;
  std::thread sweeper_;
  std::thread persister_;   // durable_.PersistLoop, with a state dir
  std::thread durability_;  // checkpoints_.Run, with a state dir
  MetricsRegistry::Registration metrics_;

  mutable SchedulerMutex lock_;
  // When the state was recovered from --state_dir (InfinitePast: never).
  absl::Time recovered_at_ ABSL_GUARDED_BY(lock_.mu) = absl::InfinitePast();
  proto::ClusterMap map_ ABSL_GUARDED_BY(lock_.mu);
  DurableState durable_ ABSL_GUARDED_BY(lock_.mu);
  Membership membership_ ABSL_GUARDED_BY(lock_.mu);
  Job job_ ABSL_GUARDED_BY(lock_.mu);
  Barriers barriers_ ABSL_GUARDED_BY(lock_.mu);
  TableRegistry tables_ ABSL_GUARDED_BY(lock_.mu);
  CheckpointCoordinator checkpoints_ ABSL_GUARDED_BY(lock_.mu);
  NodeLifecycle lifecycle_ ABSL_GUARDED_BY(lock_.mu);
};

}  // namespace

absl::StatusOr<std::unique_ptr<Scheduler>> Scheduler::Create(
    const SchedulerOptions& options) {
  auto s = std::make_unique<SchedulerImpl>(options);
  absl::Status started = s->Start();
  if (!started.ok()) return started;
  return std::unique_ptr<Scheduler>(std::move(s));
}

}  // namespace downpour
