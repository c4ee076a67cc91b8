#include "scheduler/scheduler.h"

#include <algorithm>
#include <deque>
#include <limits>
#include <set>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/container/btree_set.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "cluster/server_admin_client.h"
#include "common/grpc_server.h"
#include "common/grpc_status.h"
#include "common/logging.h"
#include "common/status_macros.h"
#include "common/types.h"
#include "google/protobuf/util/message_differencer.h"
#include "grpcpp/grpcpp.h"
#include "handlers/handler.h"
#include "proto/downpour.grpc.pb.h"
#include "scheduler/capacity.h"
#include "scheduler/checkpoints.h"
#include "scheduler/job_metrics.h"
#include "scheduler/placement.h"
#include "scheduler/request_checks.h"
#include "scheduler/state_store.h"
#include "scheduler/table_spec.h"
#include "scheduler/worker_roster.h"

namespace downpour {
namespace {

class SchedulerImpl final : public Scheduler, public proto::Scheduler::Service {
 public:
  explicit SchedulerImpl(const SchedulerOptions& o)
      : options_(o),
        admins_(o.auth),
        clocks_(o.policy),
        roster_(o.policy, o.worker_loss) {
    o.policy.ToJob(&job_);
    workers_.resize(clocks_.size());
    for (int r = 0; r < clocks_.size(); ++r) workers_[r].set_rank(r);
  }
  ~SchedulerImpl() override { Shutdown(); }

  absl::Status Start() {
    if (!options_.state_dir.empty()) {
      DP_ASSIGN_OR_RETURN(store_, StateStore::Open(options_.state_dir));
      DP_RETURN_IF_ERROR(Recover());
    }
    DP_ASSIGN_OR_RETURN(StartedGrpcServer started,
                        StartGrpcServer(options_.listen_address, this,
                                        "the scheduler", options_.auth));
    health_ = std::move(started.health);
    server_ = std::move(started.server);
    port_ = started.port;
    sweeper_ = std::thread([this] { SweepLoop(); });
    if (store_ != nullptr) {
      persister_ = std::thread([this] { PersistLoop(); });
      durability_ = std::thread([this] { DurabilityLoop(); });
    }
    if (options_.metrics != nullptr) {
      metrics_ = options_.metrics->Add([this](MetricWriter* w) {
        proto::ClusterMap map;
        proto::JobStatus job;
        SchedulerEvents events;
        {
          absl::MutexLock lock(&mu_);
          map = map_;
          FillJobStatus(&job);
          events = events_;
        }
        WriteSchedulerMetrics(map, job, events, w);
      });
    }
    DP_LOG(INFO) << "scheduler listening on port " << port_;
    return absl::OkStatus();
  }

  int port() const override { return port_; }

  void Wait() override {
    absl::MutexLock lock(&mu_);
    mu_.Await(absl::Condition(&stopped_));
  }

  void Shutdown() override {
    {
      absl::MutexLock lock(&mu_);
      if (stopping_) {
        // Another thread is shutting down: return once it has finished.
        mu_.Await(absl::Condition(&stopped_));
        return;
      }
      stopping_ = true;
    }
    metrics_.Reset();
    if (sweeper_.joinable()) sweeper_.join();
    if (durability_.joinable()) durability_.join();
    // Streams and barriers notice stopping_ within their wait slice.
    if (server_) {
      server_->Shutdown(std::chrono::system_clock::now() +
                        std::chrono::seconds(2));
    }
    // The last changes reach the disk before Wait() returns.
    if (persister_.joinable()) persister_.join();
    absl::MutexLock lock(&mu_);
    stopped_ = true;
  }

  proto::ClusterMap CurrentMap() const override {
    absl::MutexLock lock(&mu_);
    return published_;
  }

  absl::StatusOr<proto::CheckpointManifest> Checkpoint(
      absl::Duration timeout, const proto::LbfgsState& lbfgs) override {
    if (store_ == nullptr) {
      return absl::FailedPreconditionError(
          "checkpoints need the scheduler's --state_dir (the manifests live "
          "there)");
    }
    auto waiter = std::make_shared<CheckpointWaiter>();
    waiter->lbfgs = lbfgs;
    absl::MutexLock lock(&mu_);
    if (stopped_) return absl::UnavailableError("scheduler stopped");
    checkpoint_requests_.push_back(waiter);
    auto done = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return waiter->done || stopped_;
    };
    if (!mu_.AwaitWithTimeout(absl::Condition(&done), timeout)) {
      return absl::DeadlineExceededError(
          absl::StrCat("checkpoint not complete after ",
                       absl::FormatDuration(timeout), " (it goes on)"));
    }
    if (!waiter->done) return absl::UnavailableError("scheduler stopped");
    return waiter->result;
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
    absl::MutexLock lock(&mu_);
    if (req->role() == proto::WORKER) {
      if (std::string why = WorkersHeldBack(); !why.empty()) {
        return Err(absl::UnavailableError(
            absl::StrCat("register worker '", req->name(), "': ", why)));
      }
    }
    proto::NodeInfo* node = nullptr;
    if (!req->name().empty()) {
      for (auto& n : *map_.mutable_nodes()) {
        if (n.name() == req->name() && n.role() == req->role()) node = &n;
      }
    }
    if (node != nullptr && node->state() == proto::ALIVE &&
        req->incarnation() != 0 && req->incarnation() == node->incarnation()) {
      // The same process again: a retry whose reply was lost (e.g. the
      // scheduler restarted meanwhile). It keeps what it got.
      last_seen_[node->id()] = absl::Now();
      unconfirmed_.erase(node->id());
      const auto r = rank_of_.find(node->id());
      return Err(FinishRegister(*node, r == rank_of_.end() ? -1 : r->second,
                                version_, reply));
    }
    if (absl::Status s = CheckRoomForNode(*req, node); !s.ok()) return Err(s);
    if (node != nullptr && node->state() == proto::ALIVE) {
      if (req->incarnation() == 0 ||
          req->incarnation() == node->incarnation()) {
        return Err(absl::AlreadyExistsError(absl::StrCat(
            "register: node '", req->name(), "' is alive as id ", node->id())));
      }
      // The same name from a new process: the old one is gone (a pod
      // restarted faster than its heartbeats expired). Fail it over now.
      DP_LOG(WARNING) << "node '" << req->name() << "' (id " << node->id()
                      << ") registered again from a new process; the old "
                      << "one is declared dead";
      MarkDead(node);
      if (node->role() == proto::SERVER) RemoveDeadServer(node->id());
    }
    // A server registering again as a new process has lost its memory.
    const bool new_incarnation = node != nullptr &&
                                 node->role() == proto::SERVER &&
                                 req->incarnation() != node->incarnation();
    int rank = -1;
    if (req->role() == proto::WORKER) {
      absl::StatusOr<int> granted = GrantRank(*req, node);
      if (!granted.ok()) return Err(granted.status());
      rank = *granted;
      if (absl::Status s = TakeOverRank(rank, req->name()); !s.ok()) {
        return Err(s);
      }
    }
    if (node == nullptr) {
      node = map_.add_nodes();
      // A node that had an id from a scheduler that lost its state gets it
      // back if nobody holds it; ids stay unique either way.
      const NodeId previous = req->previous_id();
      if (previous != kNoNode && FindNode(previous) == nullptr) {
        node->set_id(previous);
        next_node_id_ = std::max(next_node_id_, previous + 1);
      } else {
        node->set_id(next_node_id_++);
      }
    }
    rolled_back_.erase(node->id());
    if (rank >= 0) {
      // A DEAD worker that held this rank gives it up.
      auto held = rank_holder_.find(rank);
      if (held != rank_holder_.end() && held->second != node->id()) {
        rank_of_.erase(held->second);
      }
      rank_holder_[rank] = node->id();
      rank_of_[node->id()] = rank;
    }
    reply->set_rank(rank);
    *reply->mutable_job() = job_;
    node->set_role(req->role());
    node->set_state(proto::ALIVE);
    node->set_name(req->name());
    node->set_data_endpoint(req->data_endpoint());
    node->set_admin_address(req->admin_address());
    node->mutable_plugin_handlers()->CopyFrom(req->plugin_handlers());
    node->set_incarnation(req->incarnation());
    node->set_max_message_bytes(req->max_message_bytes());
    node->set_memory_limit_bytes(req->memory_limit_bytes());
    // What it could not hold before may fit the new process.
    ForgetRefusals(node->id());
    last_seen_[node->id()] = absl::Now();
    suspect_since_.erase(node->id());
    unconfirmed_.erase(node->id());
    applied_[node->id()] = 0;
    const int lost_before = LostRanges(map_);
    if (new_incarnation && ForgetServerData(&map_, node->id())) {
      events_.ranges_lost += LostRanges(map_) - lost_before;
      if (!manifests_.empty() && restoring_ == 0) {
        // Its data is gone and no other server holds it: the job goes back
        // to the newest checkpoint (DurabilityLoop).
        restoring_ = manifests_.back().id();
        DP_LOG(WARNING) << "server '" << req->name() << "' (id " << node->id()
                        << ") restarted without the data of "
                        << "ranges only it held: the job rolls back to "
                        << "checkpoint " << restoring_ << " (clock "
                        << manifests_.back().clock() << ")";
      } else if (restoring_ == 0) {
        DP_LOG(WARNING) << "server '" << req->name() << "' (id " << node->id()
                        << ") restarted: ranges only it held are lost";
      }
    }
    if (req->role() == proto::SERVER) RefillWithinRoom();
    ResolvePending();
    BumpEpoch();
    DP_LOG(INFO) << proto::NodeRole_Name(req->role()) << " '" << req->name()
                 << "' registered as node " << node->id() << " ("
                 << req->data_endpoint() << "), epoch " << map_.epoch();
    return Err(FinishRegister(*node, rank, Commit(), reply));
  }

  grpc::Status Heartbeat(grpc::ServerContext* ctx,
                         const proto::HeartbeatRequest* req,
                         proto::HeartbeatReply* reply) override {
    absl::MutexLock lock(&mu_);
    proto::NodeInfo* node = FindNode(req->node_id());
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
    if (node->role() == proto::WORKER && !roster_.failure().ok()) {
      return Err(roster_.failure());
    }
    last_seen_[node->id()] = absl::Now();
    unconfirmed_.erase(node->id());
    RecordApplied(node->id(), req->applied_epoch());
    ResolvePending();
    reply->set_epoch(published_.epoch());
    return grpc::Status::OK;
  }

  grpc::Status Leave(grpc::ServerContext* ctx, const proto::LeaveRequest* req,
                     proto::LeaveReply*) override {
    absl::MutexLock lock(&mu_);
    proto::NodeInfo* node = FindNode(req->node_id());
    if (node == nullptr) {
      return Err(absl::NotFoundError(
          absl::StrCat("leave: unknown node ", req->node_id())));
    }
    if (node->role() != proto::WORKER) {
      return Err(absl::InvalidArgumentError(absl::StrCat(
          "leave: node ", node->id(), " ('", node->name(),
          "') is not a worker; servers are failed over when they die")));
    }
    if (node->state() != proto::ALIVE) return grpc::Status::OK;
    node->set_state(proto::LEFT);
    suspect_since_.erase(node->id());
    WorkerGone(node->id(), node->name(),
               absl::StrCat("left: ", Printable(req->reason(), 200)),
               req->finished());
    BumpEpoch();
    DP_LOG(INFO) << "worker '" << node->name() << "' (node " << node->id()
                 << ") left" << (req->finished() ? " after its last step" : "")
                 << ": " << Printable(req->reason(), 200) << "; epoch "
                 << map_.epoch();
    // Published (and, with a state dir, on disk) before the worker exits.
    return Err(AwaitDurable(Commit()));
  }

  grpc::Status AckEpoch(grpc::ServerContext* ctx,
                        const proto::AckEpochRequest* req,
                        proto::AckEpochReply*) override {
    if (absl::Status s = CheckTableFailures(*req); !s.ok()) return Err(s);
    absl::MutexLock lock(&mu_);
    if (FindNode(req->node_id()) == nullptr) {
      return Err(
          absl::NotFoundError(absl::StrCat("unknown node ", req->node_id())));
    }
    // Failures first: the epoch they come with must not count as applied
    // for a table this server could not create.
    for (const proto::TableFailure& f : req->failed_tables()) {
      TableFailed(req->node_id(), f);
    }
    RecordApplied(req->node_id(), req->epoch());
    ResolvePending();
    return grpc::Status::OK;
  }

  grpc::Status GetClusterMap(grpc::ServerContext* ctx,
                             const proto::GetClusterMapRequest*,
                             proto::ClusterMap* map) override {
    absl::MutexLock lock(&mu_);
    *map = published_;
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
        absl::MutexLock lock(&mu_);
        auto changed = [this, known]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
          return stopping_ || published_.epoch() > known;
        };
        // Short slices: a stream that breaks is how a killed node first
        // shows, and failover waits for it.
        mu_.AwaitWithTimeout(absl::Condition(&changed), absl::Milliseconds(50));
        if (stopping_) break;
        if (published_.epoch() <= known) continue;
        map = published_;
      }
      known = map.epoch();
      if (!writer->Write(map)) {  // not under the lock
        broken = true;
        break;
      }
    }
    if (broken && req->node_id() != kNoNode) {
      absl::MutexLock lock(&mu_);
      if (!stopping_) Suspect(req->node_id(), "its map watch stream broke");
    }
    return grpc::Status::OK;
  }

  grpc::Status CreateTable(grpc::ServerContext* ctx,
                           const proto::CreateTableRequest* req,
                           proto::CreateTableReply* reply) override {
    if (absl::Status s = CheckTableStrings(req->spec()); !s.ok()) return Err(s);
    return Err(DoCreateTable(*req, reply));
  }

  grpc::Status AdvanceClock(grpc::ServerContext* ctx,
                            const proto::AdvanceClockRequest* req,
                            proto::AdvanceClockReply* reply) override {
    absl::MutexLock lock(&mu_);
    // A failed job stays failed: its workers stop, whatever they report.
    if (!roster_.failure().ok()) return Err(roster_.failure());
    if (restoring_ != 0) {
      return Err(absl::UnavailableError(absl::StrCat(
          "advance clock: the job is being restored from checkpoint ",
          restoring_)));
    }
    if (rolled_back_.contains(req->node_id())) {
      return Err(absl::FailedPreconditionError(absl::StrCat(
          "advance clock of worker ", req->rank(), " to ", req->clock(),
          ": the job was rolled back to checkpoint ", restored_from_,
          " at clock ", restored_clock_,
          "; this worker must register again (restart it) to resume there")));
    }
    if (absl::Status s =
            CheckRankHolder("advance clock", req->node_id(), req->rank());
        !s.ok()) {
      return Err(s);
    }
    const Clock slack = options_.clock_report_slack;
    if (req->clock() >= clocks_.clock(req->rank()) &&
        !clocks_.WithinBound(req->rank(), req->clock(), slack)) {
      // Ahead of what the others reported: their reports may still be on
      // the way, so wait a little before refusing.
      auto within = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return stopping_ || !roster_.failure().ok() ||
               clocks_.WithinBound(req->rank(), req->clock(), slack);
      };
      // Meanwhile the claim admits the others' reports that this one's
      // record would (ClockTable::Claim).
      clocks_.Claim(req->rank(), req->clock());
      mu_.AwaitWithTimeout(absl::Condition(&within),
                           std::min(options_.clock_report_grace,
                                    TimeLeft(ctx) - absl::Milliseconds(100)));
      clocks_.Unclaim(req->rank(), req->clock());
      if (stopping_)
        return Err(absl::UnavailableError("scheduler shutting down"));
      // The job failed meanwhile: that, not the bound, is the answer.
      if (!roster_.failure().ok()) return Err(roster_.failure());
    }
    absl::Status s = clocks_.Advance(req->rank(), req->clock(), slack);
    if (!s.ok()) {
      return Err(Annotate(s, absl::StrCat("advance clock of rank ", req->rank(),
                                          " from node ", req->node_id())));
    }
    clocks_dirty_ = true;
    proto::WorkerStatus& w = workers_[req->rank()];
    w.set_clock(req->clock());
    w.set_loss(req->loss());
    w.set_examples(req->examples());
    if (req->test_accuracy() >= 0) w.set_test_accuracy(req->test_accuracy());
    w.set_max_staleness(std::max(w.max_staleness(), req->max_staleness()));
    w.set_discarded(req->discarded());
    reply->set_gating_clock(clocks_.GatingClock());
    Clock others = std::numeric_limits<Clock>::max();
    for (int r = 0; r < clocks_.size(); ++r) {
      if (r != req->rank() && !clocks_.retired(r)) {
        others = std::min(others, clocks_.clock(r));
      }
    }
    reply->set_others_min_clock(others);
    return grpc::Status::OK;
  }

  grpc::Status WaitClock(grpc::ServerContext* ctx,
                         const proto::WaitClockRequest* req,
                         proto::WaitClockReply* reply) override {
    absl::StatusOr<absl::Duration> timeout =
        CheckWait("wait clock", req->timeout_ms(), absl::Seconds(60));
    if (!timeout.ok()) return Err(timeout.status());
    absl::MutexLock lock(&mu_);
    if (absl::Status s =
            CheckRankHolder("wait clock", req->node_id(), req->rank());
        !s.ok()) {
      return Err(s);
    }
    auto may = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return stopping_ || !roster_.failure().ok() ||
             clocks_.MayProceed(req->clock());
    };
    if (!mu_.AwaitWithTimeout(absl::Condition(&may), *timeout)) {
      return Err(absl::DeadlineExceededError(
          absl::StrCat("worker ", req->rank(), " at clock ", req->clock(),
                       " still blocked by gating clock ", clocks_.GatingClock(),
                       " (", clocks_.policy().ToString(), ")")));
    }
    if (stopping_)
      return Err(absl::UnavailableError("scheduler shutting down"));
    if (!roster_.failure().ok()) return Err(roster_.failure());
    reply->set_gating_clock(clocks_.GatingClock());
    return grpc::Status::OK;
  }

  grpc::Status GetJobStatus(grpc::ServerContext* ctx,
                            const proto::JobStatusRequest*,
                            proto::JobStatus* status) override {
    absl::MutexLock lock(&mu_);
    FillJobStatus(status);
    return grpc::Status::OK;
  }

  grpc::Status ReplicaReady(grpc::ServerContext* ctx,
                            const proto::ReplicaReadyRequest* req,
                            proto::ReplicaReadyReply*) override {
    absl::MutexLock lock(&mu_);
    if (req->hand_over()) {
      // The primary stopped writing in that map; any other map may have
      // made it write again (a retired rank completing a step), so it
      // reports again on the next one.
      if (req->epoch() != map_.epoch()) {
        return Err(absl::FailedPreconditionError(absl::StrCat(
            "handover report from map epoch ", req->epoch(), ", the map is at ",
            map_.epoch(), "; report again from the current map")));
      }
      absl::Status s = HandOver(&map_, req->table_id(), req->range_begin(),
                                req->primary(), req->backup());
      if (!s.ok()) return Err(s);
      // The handovers left, if any, get a full timeout from the next sweep.
      handover_started_ = absl::InfiniteFuture();
      if (options_.balance_primaries) BalancePrimaries(&map_);
      BumpEpoch();
      DP_LOG(INFO) << "table " << req->table_id() << " range from key "
                   << req->range_begin() << ": handed from server "
                   << req->primary() << " to " << req->backup() << ", epoch "
                   << map_.epoch();
      return Err(AwaitDurable(Commit()));
    }
    absl::Status s = MarkInSync(&map_, req->table_id(), req->range_begin(),
                                req->primary(), req->backup());
    if (!s.ok()) return Err(s);
    if (options_.balance_primaries) BalancePrimaries(&map_);
    BumpEpoch();
    DP_LOG(INFO) << "table " << req->table_id() << " range from key "
                 << req->range_begin() << ": backup " << req->backup()
                 << " in sync, epoch " << map_.epoch();
    // The primary reports once: it must not be forgotten by a restart.
    return Err(AwaitDurable(Commit()));
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
    absl::MutexLock lock(&mu_);
    for (const auto& m : manifests_) *reply->add_checkpoints() = m;
    return grpc::Status::OK;
  }

  // The operator's rollback (psctl restore): the same restore as after a
  // lost range (RunRestore), of the checkpoint asked for.
  grpc::Status RestoreCheckpoint(
      grpc::ServerContext*, const proto::RestoreCheckpointRequest* req,
      proto::RestoreCheckpointReply* reply) override {
    absl::StatusOr<absl::Duration> timeout =
        CheckWait("restore", req->timeout_ms(), absl::Minutes(10));
    if (!timeout.ok()) return Err(timeout.status());
    const uint64_t id = req->checkpoint_id();
    absl::MutexLock lock(&mu_);
    if (store_ == nullptr) {
      return Err(absl::FailedPreconditionError(
          "restore: checkpoints need the scheduler's --state_dir (the "
          "manifests live there)"));
    }
    if (FindManifest(id) == nullptr) {
      std::vector<uint64_t> kept;
      for (const auto& m : manifests_) kept.push_back(m.id());
      return Err(absl::NotFoundError(absl::StrCat(
          "restore: no complete checkpoint ", id, " (",
          kept.empty()
              ? "there is none"
              : absl::StrCat("the scheduler keeps ", absl::StrJoin(kept, ", ")),
          ")")));
    }
    if (restoring_ != 0) {
      return Err(absl::FailedPreconditionError(absl::StrCat(
          "restore of checkpoint ", id, ": the restore of checkpoint ",
          restoring_, " is under way")));
    }
    const uint64_t completed_before = restores_completed_;
    restoring_ = id;
    restore_epoch_ = 0;
    DP_LOG(WARNING) << "operator: the job rolls back to checkpoint " << id
                    << " (clock " << FindManifest(id)->clock() << ")";
    // The restore runs from here whether or not its record reaches the
    // disk (DurabilityLoop may already have started it); a scheduler
    // restarted without the record does not finish it.
    if (absl::Status s = AwaitDurable(Commit()); !s.ok()) {
      DP_LOG(ERROR) << "restore of checkpoint " << id << ": " << s;
    }
    auto done = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return stopping_ || restoring_ == 0;
    };
    if (!mu_.AwaitWithTimeout(absl::Condition(&done), *timeout)) {
      return Err(absl::DeadlineExceededError(absl::StrCat(
          "restore of checkpoint ", id, " not complete after ",
          absl::FormatDuration(*timeout),
          " (it goes on; the scheduler's log says what it waits for)")));
    }
    if (stopping_) return Err(absl::UnavailableError("scheduler stopping"));
    if (restores_completed_ == completed_before || restored_from_ != id) {
      return Err(absl::AbortedError(absl::StrCat(
          "restore of checkpoint ", id, " failed",
          restores_completed_ > completed_before
              ? absl::StrCat("; the job went back to the older checkpoint ",
                             restored_from_, " instead")
              : "; see the scheduler's log")));
    }
    *reply->mutable_manifest() = *FindManifest(id);
    reply->set_epoch(map_.epoch());
    return grpc::Status::OK;
  }

  grpc::Status ReportUnreachable(grpc::ServerContext* ctx,
                                 const proto::ReportUnreachableRequest* req,
                                 proto::ReportUnreachableReply*) override {
    absl::MutexLock lock(&mu_);
    Suspect(req->suspect(), absl::StrCat("node ", req->reporter(), ": ",
                                         Printable(req->reason(), 200)));
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
    absl::MutexLock lock(&mu_);
    if (!barriers_.contains(req->name()) &&
        static_cast<int>(barriers_.size()) >= options_.max_nodes) {
      return Err(absl::ResourceExhaustedError(
          absl::StrCat("barrier '", req->name(), "': ", barriers_.size(),
                       " barriers are open already")));
    }
    // A barrier of all the job's workers (JobMember::Barrier) does not wait
    // for ranks the job goes on without: those the backup workers absorb
    // and those retired (--on_worker_loss=continue). That can change while
    // it waits.
    const proto::NodeInfo* caller = FindNode(req->node_id());
    const bool job_barrier =
        caller != nullptr && caller->role() == proto::WORKER &&
        req->count() == static_cast<uint32_t>(clocks_.size());
    auto complete =
        [&](const BarrierState& state) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
          if (!job_barrier) return state.arrived.size() >= req->count();
          // Arrivals of ranks given up since do not count twice.
          int arrived = 0;
          for (NodeId n : state.arrived) {
            auto r = rank_of_.find(n);
            arrived += r == rank_of_.end() ||
                       !(roster_.lost(r->second) || roster_.retired(r->second));
          }
          return arrived >= std::max<int>(1, static_cast<int>(req->count()) -
                                                 roster_.NotWaitedFor());
        };
    BarrierState& b = barriers_[req->name()];
    const uint64_t generation = b.generation;
    b.arrived.insert(req->node_id());
    auto release = [&](BarrierState& state) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      state.arrived.clear();
      state.generation++;
      ForgetBarrierIfIdle(req->name());  // `state` may be gone from here on
      RecordPassedBarrier(req->name());
      reply->set_arrived(req->count());
      return grpc::Status::OK;
    };
    if (complete(b)) return release(b);
    ++b.waiters;
    // `b` may move while the lock is released: look it up again.
    auto released = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      const BarrierState& now = barriers_[req->name()];
      return stopping_ || !roster_.failure().ok() ||
             now.generation != generation || complete(now);
    };
    const bool in_time =
        mu_.AwaitWithTimeout(absl::Condition(&released), *timeout);
    BarrierState& after = barriers_[req->name()];
    --after.waiters;
    if (!stopping_ && roster_.failure().ok() &&
        after.generation == generation && complete(after)) {
      // The ranks still missing were given up while it waited.
      return release(after);
    }
    if (!in_time) {
      after.arrived.erase(req->node_id());
      const size_t arrived = after.arrived.size() + 1;
      ForgetBarrierIfIdle(req->name());
      return Err(absl::DeadlineExceededError(
          absl::StrCat("barrier '", req->name(), "': ", arrived, " of ",
                       req->count(), " arrived in time")));
    }
    // Woken without the barrier released: the job failed (or stops).
    const bool released_now = after.generation != generation;
    if (!released_now) after.arrived.erase(req->node_id());
    ForgetBarrierIfIdle(req->name());  // `after` may be gone from here on
    if (stopping_)
      return Err(absl::UnavailableError("scheduler shutting down"));
    if (!released_now) return Err(roster_.failure());
    reply->set_arrived(req->count());
    return grpc::Status::OK;
  }

 private:
  struct BarrierState {
    uint64_t generation = 0;
    absl::flat_hash_set<NodeId> arrived;
    int waiters = 0;  // calls blocked on it
  };
  // A table declared but not yet acknowledged by every server that was
  // live when it was declared.
  struct PendingTable {
    TableId id = kNoTable;
    std::string name;
    Epoch epoch = 0;
    std::vector<NodeId> waiting;
    bool resolved = false;  // acknowledged by all, or failed
    absl::Status failure;   // a server could not create it: rolled back
  };

  static grpc::Status Err(const absl::Status& s) { return ToGrpcStatus(s); }

  // The rank a registering worker gets; `node` is the known node of its
  // name and role, if any (never ALIVE here). Granting it is left to the
  // caller. An explicit request is granted exactly, a same-name worker gets
  // its old rank back, a new one the smallest rank nobody holds; a rank whose
  // holder is DEAD is free.
  absl::StatusOr<int> GrantRank(const proto::RegisterRequest& req,
                                const proto::NodeInfo* node) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    const int size = clocks_.size();
    const auto old =
        node == nullptr ? rank_of_.end() : rank_of_.find(node->id());
    int want = -1;
    if (req.has_requested_rank()) {
      want = req.requested_rank();
      if (want < 0 || want >= size) {
        return absl::InvalidArgumentError(
            absl::StrCat("register: worker '", req.name(), "' asks for rank ",
                         want, ", outside the job's ranks [0, ", size,
                         ") (num_workers + backup_workers)"));
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
      for (int r = 0; r < size && want < 0; ++r) {
        if (!rank_holder_.contains(r)) want = r;
      }
      if (want < 0) {
        return absl::ResourceExhaustedError(
            absl::StrCat("register: the job has ", size, " workers already"));
      }
    }
    const auto held = rank_holder_.find(want);
    if (held != rank_holder_.end() &&
        (node == nullptr || held->second != node->id())) {
      const proto::NodeInfo* holder = FindNodeConst(held->second);
      if (holder != nullptr && holder->state() == proto::ALIVE) {
        return absl::AlreadyExistsError(absl::StrCat(
            "register: rank ", want, " is held by worker '", holder->name(),
            "' (node ", holder->id(), "), which is alive"));
      }
    }
    return want;
  }

  proto::NodeInfo* FindNode(NodeId id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    for (auto& n : *map_.mutable_nodes()) {
      if (n.id() == id) return &n;
    }
    return nullptr;
  }
  const proto::NodeInfo* FindNodeConst(NodeId id) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    for (const auto& n : map_.nodes()) {
      if (n.id() == id) return &n;
    }
    return nullptr;
  }
  std::vector<const proto::NodeInfo*> AliveServers() const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    std::vector<const proto::NodeInfo*> out;
    for (const auto& n : map_.nodes()) {
      if (n.role() == proto::SERVER && n.state() == proto::ALIVE)
        out.push_back(&n);
    }
    return out;
  }
  void RecordApplied(NodeId id, Epoch epoch)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    applied_[id] = std::max(applied_[id], epoch);
  }
  void BumpEpoch() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    map_.set_epoch(map_.epoch() + 1);
  }
  void FillJobStatus(proto::JobStatus* status) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    *status->mutable_job() = job_;
    status->set_gating_clock(clocks_.GatingClock());
    for (const auto& w : workers_) *status->add_workers() = w;
    if (!roster_.failure().ok()) {
      status->set_failure(std::string(roster_.failure().message()));
    }
  }
  // Declares `node` dead (and counts it). A server must then leave its
  // ranges: RemoveDeadServer, once every node dying with it is marked.
  void MarkDead(proto::NodeInfo* node) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    node->set_state(proto::DEAD);
    if (node->role() == proto::WORKER) ++events_.workers_declared_dead;
    if (node->role() == proto::SERVER) ++events_.servers_declared_dead;
  }
  // RemoveServer, counting the ranges a backup took over.
  void RemoveDeadServer(NodeId id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    const int primary_before = PrimaryRangesOf(map_, id);
    RemoveServer(&map_, id);
    events_.promotions += primary_before - PrimaryRangesOf(map_, id);
  }

  // A table that follows the job gets its enforcement from the job's
  // policy, the one rule for every table of the job; declaring it by hand
  // as well is kInvalidArgument, since it could contradict the job.
  absl::Status ApplyJobPolicy(proto::TableSpec* spec) const {
    if (!spec->follows_job()) return absl::OkStatus();
    if (spec->sync_workers() != 0 || spec->num_workers() != 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("table '", spec->name(), "': follows the job's policy (",
                       options_.policy.ToString(), ") but sets sync_workers ",
                       spec->sync_workers(), " and num_workers ",
                       spec->num_workers(), " itself; leave both 0"));
    }
    spec->set_sync_workers(options_.policy.sync_workers());
    spec->set_num_workers(options_.policy.tracked_workers());
    return absl::OkStatus();
  }

  // The existing table named like `spec` (nullptr if none); kAlreadyExists
  // if its spec differs (ids aside).
  absl::StatusOr<const proto::TableMap*> FindTable(
      const proto::TableSpec& spec) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    for (const auto& t : map_.tables()) {
      if (t.spec().name() != spec.name()) continue;
      proto::TableSpec existing = t.spec();
      existing.set_id(0);
      if (!google::protobuf::util::MessageDifferencer::Equals(existing, spec)) {
        return absl::AlreadyExistsError(absl::StrCat(
            "table '", spec.name(), "' exists with a different spec"));
      }
      return &t;
    }
    return nullptr;
  }

  absl::Status DoCreateTable(const proto::CreateTableRequest& req,
                             proto::CreateTableReply* reply)
      ABSL_LOCKS_EXCLUDED(mu_) {
    DP_ASSIGN_OR_RETURN(
        const absl::Duration timeout,
        CheckWait("create table", req.timeout_ms(), absl::Seconds(10)));
    const absl::Time deadline = absl::Now() + timeout;
    proto::TableSpec spec = req.spec();
    spec.set_id(0);
    // A malformed spec fails at once, without waiting for servers.
    DP_RETURN_IF_ERROR(ApplyJobPolicy(&spec));
    DP_RETURN_IF_ERROR(ValidateTableShape(spec));
    absl::MutexLock lock(&mu_);
    if (restoring_ != 0) {
      return absl::UnavailableError(absl::StrCat(
          "create table '", spec.name(),
          "': the job is being restored from checkpoint ", restoring_));
    }
    // An existing table: OK once every server has it (an identical
    // declaration still pending waits for its outcome).
    auto existing_reply =
        [&](const proto::TableMap* t) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
          const TableId id = t->spec().id();
          if (auto p = pending_.find(id); p != pending_.end()) {
            std::shared_ptr<PendingTable> pending = p->second;
            DP_RETURN_IF_ERROR(AwaitDeclared(*pending, deadline));
          }
          const proto::TableMap* now = FindTableById(id);
          if (now == nullptr) {
            return absl::AbortedError(absl::StrCat(
                "create table '", spec.name(), "': removed meanwhile; retry"));
          }
          *reply->mutable_spec() = now->spec();
          reply->set_epoch(published_.epoch());
          reply->set_created(false);
          return absl::OkStatus();
        };
    {
      DP_ASSIGN_OR_RETURN(const proto::TableMap* t, FindTable(spec));
      if (t != nullptr) return existing_reply(t);
    }
    // Enough live servers first.
    const int need = std::max(1, options_.min_servers);
    auto enough = [this, need]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return stopping_ || static_cast<int>(AliveServers().size()) >= need;
    };
    mu_.AwaitWithDeadline(absl::Condition(&enough), deadline);
    if (stopping_) return absl::UnavailableError("scheduler shutting down");
    std::vector<const proto::NodeInfo*> servers = AliveServers();
    if (static_cast<int>(servers.size()) < need) {
      return absl::UnavailableError(
          absl::StrCat("create table '", spec.name(), "': ", servers.size(),
                       " live servers after ", absl::FormatDuration(timeout),
                       ", need ", need));
    }
    // The lock was released while waiting: someone may have declared it.
    {
      DP_ASSIGN_OR_RETURN(const proto::TableMap* t, FindTable(spec));
      if (t != nullptr) return existing_reply(t);
    }
    // Plugins every live server has loaded.
    std::vector<std::string> plugins(servers[0]->plugin_handlers().begin(),
                                     servers[0]->plugin_handlers().end());
    for (const auto* s : servers) {
      absl::flat_hash_set<std::string> has(s->plugin_handlers().begin(),
                                           s->plugin_handlers().end());
      plugins.erase(std::remove_if(
                        plugins.begin(), plugins.end(),
                        [&](const std::string& p) { return !has.contains(p); }),
                    plugins.end());
    }
    DP_RETURN_IF_ERROR(ValidateTableSpec(spec, plugins));

    // Placed on a copy: it enters the map only if every server can hold
    // its share and the map stays small.
    proto::TableMap placed;
    *placed.mutable_spec() = spec;
    std::vector<NodeId> ring;
    for (const auto* s : servers) ring.push_back(s->id());
    std::sort(ring.begin(), ring.end());
    PlaceTable(&placed, ring, options_.replicas);
    DP_RETURN_IF_ERROR(CheckTableFits(map_, placed), "create table");
    DP_RETURN_IF_ERROR(CheckMapGrowth(
        absl::StrCat("create table '", spec.name(), "'"), map_.ByteSizeLong(),
        placed.ByteSizeLong() + 16, options_.max_map_bytes));

    spec.set_id(next_table_id_++);
    *placed.mutable_spec() = spec;
    proto::TableMap* table = map_.add_tables();
    *table = std::move(placed);
    BumpEpoch();
    const Epoch epoch = map_.epoch();
    auto pending = std::make_shared<PendingTable>();
    pending->id = spec.id();
    pending->name = spec.name();
    pending->epoch = epoch;
    pending->waiting = ring;
    pending_[spec.id()] = pending;
    DP_LOG(INFO) << "table '" << spec.name() << "' (id " << spec.id()
                 << ") over " << table->ranges_size() << " ranges, "
                 << options_.replicas << " holders each, epoch " << epoch;
    // Servers see the table once it is on disk here: a restarted scheduler
    // never gives its id to another table. (`table` may move meanwhile.)
    DP_RETURN_IF_ERROR(AwaitDurable(Commit()), "create table '", spec.name(),
                       "'");
    DP_RETURN_IF_ERROR(AwaitDeclared(*pending, deadline));
    *reply->mutable_spec() = spec;
    reply->set_epoch(epoch);
    reply->set_created(true);
    return absl::OkStatus();
  }

  // Waits until every server `p` waits for has acknowledged its epoch
  // (OK), or one reported that it cannot create it (its error; the table
  // is gone from the map), or `deadline` (kDeadlineExceeded naming the
  // servers; the table stays pending).
  absl::Status AwaitDeclared(PendingTable& p, absl::Time deadline)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    auto done = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return stopping_ || p.resolved || Late(p).empty();
    };
    mu_.AwaitWithDeadline(absl::Condition(&done), deadline);
    if (!p.resolved && Late(p).empty()) Resolve(p);
    if (!p.failure.ok()) return p.failure;
    if (p.resolved) return absl::OkStatus();
    if (stopping_) return absl::UnavailableError("scheduler shutting down");
    return absl::DeadlineExceededError(absl::StrCat(
        "table '", p.name, "' declared, but servers ",
        absl::StrJoin(Late(p), ", "), " did not apply epoch ", p.epoch,
        " in time; it is still being declared (a later failure on a server "
        "removes it)"));
  }

  // The servers `p` still waits for: alive, and behind its epoch.
  std::vector<NodeId> Late(const PendingTable& p)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    std::vector<NodeId> out;
    for (NodeId id : p.waiting) {
      const proto::NodeInfo* n = FindNode(id);
      if (n != nullptr && n->state() == proto::ALIVE &&
          applied_[id] < p.epoch) {
        out.push_back(id);
      }
    }
    return out;
  }

  void Resolve(PendingTable& p) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    p.resolved = true;
    pending_.erase(p.id);
  }

  // Tables every server they wait for has acknowledged are declared.
  void ResolvePending() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    std::vector<std::shared_ptr<PendingTable>> done;
    for (const auto& [id, p] : pending_) {
      if (Late(*p).empty()) done.push_back(p);
    }
    for (const auto& p : done) Resolve(*p);
    // Not waited for: a restarted scheduler that still finds one pending
    // resolves it again once the servers report the epoch.
    if (!done.empty()) Commit();
  }

  // Server `node` reports that it cannot create or hold table
  // `f.table_id()`. A table still being declared is removed (all or
  // nothing); for a table in use, the server is taken off the ranges it
  // was catching up on and not chosen for that table again.
  void TableFailed(NodeId node, const proto::TableFailure& f)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    const proto::NodeInfo* n = FindNode(node);
    const std::string server = absl::StrCat(
        "server ", node, " ('", n == nullptr ? "" : n->name(), "')");
    const absl::Status why(static_cast<absl::StatusCode>(f.code()),
                           Printable(f.message(), kMaxFailureMessageBytes));
    if (auto p = pending_.find(f.table_id()); p != pending_.end()) {
      std::shared_ptr<PendingTable> pending = p->second;
      pending->failure = Annotate(
          why, absl::StrCat("table '", pending->name, "' not created: ", server,
                            " cannot create it"));
      Resolve(*pending);
      RemoveTable(f.table_id());
      BumpEpoch();
      Commit();
      DP_LOG(WARNING) << pending->failure << "; removed again, epoch "
                      << map_.epoch();
      return;
    }
    if (FindTableById(f.table_id()) == nullptr) return;  // removed already
    if (!refused_.insert({node, f.table_id()}).second) return;
    DP_LOG(WARNING) << server << " cannot hold table " << f.table_id() << ": "
                    << why;
    if (DropCatchingUp(&map_, f.table_id(), node)) {
      RefillWithinRoom();
      BumpEpoch();
      DP_LOG(WARNING) << server << " taken off the ranges of table "
                      << f.table_id() << " it was catching up on, epoch "
                      << map_.epoch();
    }
    Commit();  // the refusal too
  }

  void RemoveTable(TableId id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    auto* tables = map_.mutable_tables();
    for (int i = 0; i < tables->size(); ++i) {
      if (tables->Get(i).spec().id() != id) continue;
      tables->erase(tables->begin() + i);
      break;
    }
    for (auto it = refused_.begin(); it != refused_.end();) {
      if (it->second == id) {
        refused_.erase(it++);
      } else {
        ++it;
      }
    }
  }

  void ForgetRefusals(NodeId node) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    for (auto it = refused_.begin(); it != refused_.end();) {
      if (it->first == node) {
        refused_.erase(it++);
      } else {
        ++it;
      }
    }
  }

  // Backups for ranges short of them, only on servers with room for them
  // and not on a server that could not hold that table before.
  void RefillWithinRoom() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    absl::flat_hash_map<NodeId, uint64_t> room = RoomLeft(map_);
    Refill(&map_, options_.replicas, &room, &refused_);
  }

  const proto::TableMap* FindTableById(TableId id) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    for (const auto& t : map_.tables()) {
      if (t.spec().id() == id) return &t;
    }
    return nullptr;
  }

  // A registration adds at most one node: the node cap, and the map's
  // size with this node's entry (replacing `same`, its earlier one).
  absl::Status CheckRoomForNode(const proto::RegisterRequest& req,
                                const proto::NodeInfo* same) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (same == nullptr && map_.nodes_size() >= options_.max_nodes) {
      return absl::ResourceExhaustedError(
          absl::StrCat("register '", req.name(), "': the cluster lists ",
                       map_.nodes_size(), " nodes, at most ",
                       options_.max_nodes, " (dead ones are forgotten after ",
                       absl::FormatDuration(options_.forget_dead_after), ")"));
    }
    proto::NodeInfo entry;
    entry.set_id(next_node_id_);
    entry.set_role(req.role());
    entry.set_state(proto::ALIVE);
    entry.set_name(req.name());
    entry.set_data_endpoint(req.data_endpoint());
    entry.set_admin_address(req.admin_address());
    entry.mutable_plugin_handlers()->CopyFrom(req.plugin_handlers());
    entry.set_incarnation(req.incarnation());
    entry.set_max_message_bytes(req.max_message_bytes());
    entry.set_memory_limit_bytes(req.memory_limit_bytes());
    const size_t now = map_.ByteSizeLong();
    const size_t old = same == nullptr ? 0 : same->ByteSizeLong();
    return CheckMapGrowth(absl::StrCat("register '", req.name(), "'"),
                          now - std::min(now, old), entry.ByteSizeLong() + 16,
                          options_.max_map_bytes);
  }

  // A clock call for `rank` from `node`: the rank exists and `node` holds
  // it (a DEAD holder keeps it until another worker takes it over).
  absl::Status CheckRankHolder(absl::string_view what, NodeId node,
                               int rank) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
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
      const proto::NodeInfo* h = FindNodeConst(holder->second);
      held = absl::StrCat("node ", holder->second, " ('",
                          h == nullptr ? "" : h->name(), "') holds it");
    }
    return absl::PermissionDeniedError(
        absl::StrCat(what, ": node ", node, " does not hold rank ", rank, " (",
                     held, "); a worker reports only its own clock"));
  }

  // What is left of a call's deadline (long when it has none).
  static absl::Duration TimeLeft(const grpc::ServerContext* ctx) {
    const absl::Time deadline = absl::FromChrono(ctx->deadline());
    return std::max(absl::ZeroDuration(), deadline - absl::Now());
  }

  // Remembers (on disk with the state) that the job passed barrier
  // `name`, for replacements (RegisterReply.passed_barriers). Bounded: a
  // job has a few start-up barriers, not one per step.
  void RecordPassedBarrier(const std::string& name)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (passed_barriers_.contains(name)) return;
    if (passed_barriers_.size() >= kMaxPassedBarriers) {
      DP_LOG(WARNING) << "barrier '" << name << "' passed; not remembered ("
                      << kMaxPassedBarriers << " are already)";
      return;
    }
    passed_barriers_.insert(name);
    Commit();
  }

  void ForgetBarrierIfIdle(const std::string& name)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    auto it = barriers_.find(name);
    if (it != barriers_.end() && it->second.waiters == 0 &&
        it->second.arrived.empty()) {
      barriers_.erase(it);
    }
  }

  void SweepLoop() {
    // Often enough that a suspect's grace is not rounded up much.
    const absl::Duration slice =
        std::min(options_.heartbeat_interval / 2, absl::Milliseconds(50));
    absl::MutexLock lock(&mu_);
    while (!stopping_) {
      mu_.AwaitWithTimeout(absl::Condition(&stopping_), slice);
      if (stopping_) break;
      const absl::Time now = absl::Now();
      ApplyWorkerLossRule(now);
      std::vector<NodeId> dead;
      for (auto& n : *map_.mutable_nodes()) {
        if (n.state() != proto::ALIVE) continue;
        // Clients are forgotten instead (ForgetSilentNodes).
        if (n.role() != proto::SERVER && n.role() != proto::WORKER) continue;
        const absl::Time seen = last_seen_[n.id()];
        std::string why;
        if (now - seen > options_.dead_after) {
          why = absl::StrCat("missed heartbeats for ",
                             absl::FormatDuration(now - seen));
        } else if (auto s = suspect_since_.find(n.id());
                   s != suspect_since_.end() && seen < s->second.first &&
                   now - s->second.first > options_.suspect_grace) {
          why = absl::StrCat("unreachable (", s->second.second,
                             ") and silent for ",
                             absl::FormatDuration(now - seen));
        } else {
          continue;
        }
        MarkDead(&n);
        dead.push_back(n.id());
        unconfirmed_.erase(n.id());
        DP_LOG(WARNING) << "node " << n.id() << " ('" << n.name() << "') "
                        << why << "; declared dead";
      }
      // The dead first: a worker's rank is lost before its node may be
      // forgotten (workers hold no ranges, so it can be at once).
      for (NodeId id : dead) {
        suspect_since_.erase(id);
        RemoveDeadServer(id);
        const proto::NodeInfo* n = FindNodeConst(id);
        if (n != nullptr && n->role() == proto::WORKER) {
          WorkerGone(id, n->name(), "missed heartbeats", /*finished=*/false);
        }
      }
      const bool forgot = ForgetSilentNodes(now);
      const bool cancelled = CancelSlowHandOvers(now);
      if (dead.empty() && !forgot && !cancelled) continue;
      RefillWithinRoom();
      ResolvePending();
      BumpEpoch();
      Commit();
      DP_LOG(INFO) << "cluster map epoch " << map_.epoch();
    }
  }

  // Handovers (RangeAssignment.handing_to) not reported within
  // handover_timeout are cancelled: the primary refuses writes to the range
  // while one stands. The clock starts at the first sweep that sees
  // handovers under way (again after each one completes, and in a
  // restarted scheduler).
  bool CancelSlowHandOvers(absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (!HandOversUnderWay(map_)) {
      handover_started_ = absl::InfiniteFuture();
      return false;
    }
    if (handover_started_ == absl::InfiniteFuture()) handover_started_ = now;
    if (now - handover_started_ <= options_.handover_timeout) return false;
    DP_LOG(WARNING) << "primaries did not hand their ranges over within "
                    << absl::FormatDuration(options_.handover_timeout)
                    << "; the handovers are cancelled";
    CancelHandOvers(&map_);
    handover_started_ = absl::InfiniteFuture();
    return true;
  }

  // Worker loss (scheduler/worker_roster.h). The worker of node `id`
  // died or left; unless it `finished`, its rank is lost until a
  // replacement takes it.
  void WorkerGone(NodeId id, const std::string& name, const std::string& how,
                  bool finished) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    const auto it = rank_of_.find(id);
    if (it == rank_of_.end()) return;
    const int rank = it->second;
    if (finished) {
      roster_.Finished(rank);
      workers_[rank].set_finished(true);
    } else {
      roster_.Lost(rank, name, how, absl::Now());
      if (roster_.lost(rank)) {
        DP_LOG(WARNING) << "worker '" << name << "' (rank " << rank
                        << ", clock " << clocks_.clock(rank)
                        << ") lost: " << how << "; waiting up to "
                        << absl::FormatDuration(
                               options_.worker_loss.replace_timeout)
                        << " for a replacement";
      }
    }
    workers_[rank].set_lost(roster_.lost(rank));
  }
  // A worker registering for `rank` (as `name`) replaces whoever held it:
  // kFailedPrecondition if the job already went on without that rank.
  absl::Status TakeOverRank(int rank, const std::string& name)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    const bool was_lost = roster_.lost(rank);
    DP_RETURN_IF_ERROR(roster_.Replaced(rank), "register: worker '", name, "'");
    if (was_lost) {
      DP_LOG(INFO) << "worker '" << name << "' replaces the lost worker of "
                   << "rank " << rank << " from clock " << clocks_.clock(rank);
    }
    workers_[rank].set_lost(false);
    workers_[rank].set_finished(false);
    return absl::OkStatus();
  }
  // The bound on waiting for replacements: ranks given up stop gating the
  // others (continue), or the job fails (stop; the roster keeps why).
  void ApplyWorkerLossRule(absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    const bool failed_before = !roster_.failure().ok();
    const std::vector<int> retired = roster_.Check(now);
    for (int rank : retired) {
      clocks_.Retire(rank);
      workers_[rank].set_lost(false);
      workers_[rank].set_retired(true);
      // The servers complete the BSP steps held for it and leave it out of
      // their staleness figures.
      map_.add_retired_ranks(rank);
    }
    if (!retired.empty()) {
      std::sort(map_.mutable_retired_ranks()->begin(),
                map_.mutable_retired_ranks()->end());
      BumpEpoch();
    }
    // On disk: a restarted scheduler keeps the rank retired, or the job
    // failed.
    if (!retired.empty() || failed_before != !roster_.failure().ok()) Commit();
  }

  // Removes from the map the CLIENT nodes silent for dead_after and the
  // DEAD nodes silent for forget_dead_after that no range names, so that
  // the map does not grow with every node that ever came and went.
  // Returns whether it removed any.
  bool ForgetSilentNodes(absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    std::vector<NodeId> gone;
    for (const proto::NodeInfo& n : map_.nodes()) {
      const absl::Duration silent = now - last_seen_[n.id()];
      const bool client = n.role() == proto::CLIENT;
      const bool gone_node =
          n.state() == proto::DEAD || n.state() == proto::LEFT;
      if (client ? silent > options_.dead_after
                 : gone_node && silent > options_.forget_dead_after &&
                       !HoldsAnyRange(map_, n.id())) {
        gone.push_back(n.id());
      }
    }
    if (gone.empty()) return false;
    for (NodeId id : gone) {
      auto* nodes = map_.mutable_nodes();
      for (int i = 0; i < nodes->size(); ++i) {
        if (nodes->Get(i).id() != id) continue;
        DP_LOG(INFO) << proto::NodeRole_Name(nodes->Get(i).role()) << " " << id
                     << " ('" << nodes->Get(i).name()
                     << "') silent for long: forgotten";
        nodes->erase(nodes->begin() + i);
        break;
      }
      last_seen_.erase(id);
      applied_.erase(id);
      suspect_since_.erase(id);
      unconfirmed_.erase(id);
      rolled_back_.erase(id);
      ForgetRefusals(id);
      if (auto r = rank_of_.find(id); r != rank_of_.end()) {
        auto h = rank_holder_.find(r->second);
        if (h != rank_holder_.end() && h->second == id) rank_holder_.erase(h);
        rank_of_.erase(r);
      }
    }
    return true;
  }

  // Starts the grace after which an unreachable node is declared dead,
  // unless it is heard from meanwhile.
  void Suspect(NodeId id, const std::string& why)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    const proto::NodeInfo* n = FindNode(id);
    if (n == nullptr || n->state() != proto::ALIVE) return;
    if (n->role() != proto::SERVER && n->role() != proto::WORKER) return;
    if (suspect_since_.emplace(id, std::make_pair(absl::Now(), why)).second) {
      DP_LOG(INFO) << "node " << id << " ('" << n->name()
                   << "') reported unreachable: " << why;
    }
  }

  // --- Registration ---

  // Why a worker may not register now ("" if it may): during a restore, and
  // right after a restart with checkpoints until every server has been
  // heard from (a server that lost its data starts a restore, which moves
  // the clocks a worker starts from).
  std::string WorkersHeldBack() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (restoring_ != 0) {
      const proto::CheckpointManifest* m = FindManifest(restoring_);
      std::string missing;
      if (m != nullptr) {
        for (const std::string& name : ServersOf(*m)) {
          const proto::NodeInfo* n = FindByName(name, proto::SERVER);
          if (n == nullptr || n->state() != proto::ALIVE) {
            absl::StrAppend(&missing, missing.empty() ? "" : ", ", "'", name,
                            "'");
          }
        }
      }
      return absl::StrCat(
          "the job is being restored from checkpoint ", restoring_,
          m != nullptr ? absl::StrCat(" (clock ", m->clock(), ")") : "",
          missing.empty() ? ""
                          : absl::StrCat("; waiting for servers ", missing));
    }
    if (!manifests_.empty() && !unconfirmed_.empty()) {
      return absl::StrCat("the scheduler restarted and waits to hear from ",
                          unconfirmed_.size(),
                          " servers (at most --dead_after_ms)");
    }
    return "";
  }

  // Fills a registration's reply once version `version` of the state is
  // durable (the node's id must survive a restart of the scheduler).
  absl::Status FinishRegister(const proto::NodeInfo& node, int rank,
                              uint64_t version, proto::RegisterReply* reply)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    DP_RETURN_IF_ERROR(AwaitDurable(version), "register '", node.name(), "'");
    reply->set_node_id(node.id());
    reply->set_rank(rank);
    *reply->mutable_job() = job_;
    reply->set_heartbeat_interval_ms(
        absl::ToInt64Milliseconds(options_.heartbeat_interval));
    if (rank >= 0) {
      reply->set_start_clock(clocks_.clock(rank));
      for (const std::string& b : passed_barriers_) {
        reply->add_passed_barriers(b);
      }
    }
    reply->set_restored_from(restored_from_);
    *reply->mutable_map() = published_;
    return absl::OkStatus();
  }

  // --- State on disk ---

  // Records a change of the state; returns its version. With a state dir
  // the persister writes it and then publishes its map; without, the map is
  // published at once.
  uint64_t Commit() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    ++version_;
    if (store_ == nullptr) {
      published_ = map_;
      durable_version_ = version_;
    }
    return version_;
  }

  // Waits (without the lock) until version `v` is on disk and published.
  // kUnavailable if it cannot be written (a full disk): the change is then
  // not published, and the caller's client retries.
  absl::Status AwaitDurable(uint64_t v) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    auto done = [this, v]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return durable_version_ >= v || stopping_;
    };
    mu_.AwaitWithTimeout(absl::Condition(&done), absl::Seconds(10));
    if (durable_version_ >= v) return absl::OkStatus();
    if (stopping_) return absl::UnavailableError("scheduler shutting down");
    return absl::UnavailableError(
        absl::StrCat("the scheduler cannot write its state to ",
                     options_.state_dir, ": ", store_error_.ToString()));
  }

  proto::SchedulerState Snapshot() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    proto::SchedulerState state;
    state.set_format(1);
    *state.mutable_map() = map_;
    *state.mutable_job() = job_;
    for (const auto& [node, rank] : rank_of_) {
      proto::SchedulerState::Rank* r = state.add_ranks();
      r->set_rank(rank);
      r->set_node(node);
    }
    state.set_next_node_id(next_node_id_);
    state.set_next_table_id(next_table_id_);
    state.set_next_checkpoint_id(next_checkpoint_id_);
    state.set_restoring(restoring_);
    state.set_restored_from(restored_from_);
    state.set_restored_clock(restored_clock_);
    for (NodeId id : rolled_back_) state.add_rolled_back_workers(id);
    for (const std::string& b : passed_barriers_) state.add_passed_barriers(b);
    *state.mutable_roster() = roster_.Export();
    for (const auto& [id, p] : pending_) {
      proto::SchedulerState::PendingTable* t = state.add_pending_tables();
      t->set_id(p->id);
      t->set_name(p->name);
      t->set_epoch(p->epoch);
      for (NodeId n : p->waiting) t->add_waiting(n);
    }
    for (const auto& [node, table] : refused_) {
      proto::SchedulerState::Refusal* r = state.add_refusals();
      r->set_node(node);
      r->set_table(table);
    }
    return state;
  }

  proto::SchedulerClocks ClocksSnapshot() const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    proto::SchedulerClocks clocks;
    for (int r = 0; r < clocks_.size(); ++r) {
      proto::WorkerStatus* w = clocks.add_workers();
      *w = workers_[r];
      w->set_clock(clocks_.clock(r));
    }
    clocks.set_restored_from(restored_from_);
    return clocks;
  }

  // Loads what a previous scheduler left in the state dir.
  absl::Status Recover() ABSL_LOCKS_EXCLUDED(mu_) {
    DP_ASSIGN_OR_RETURN(std::optional<proto::SchedulerState> state,
                        store_->LoadState());
    DP_ASSIGN_OR_RETURN(proto::SchedulerClocks clocks, store_->LoadClocks());
    DP_ASSIGN_OR_RETURN(std::vector<proto::CheckpointManifest> manifests,
                        store_->LoadManifests());
    absl::MutexLock lock(&mu_);
    if (!state.has_value()) {
      // A new directory: the job is recorded at once, so that a restart
      // with other job flags is refused.
      ++version_;
      durable_version_ = version_;
      return store_->SaveState(Snapshot().SerializeAsString());
    }
    if (!google::protobuf::util::MessageDifferencer::Equals(state->job(),
                                                            job_)) {
      return absl::FailedPreconditionError(absl::StrCat(
          "state dir ", options_.state_dir, " holds another job (",
          state->job().ShortDebugString(), "); the flags give (",
          job_.ShortDebugString(),
          "): start with the same --consistency, --staleness, --num_workers "
          "and --backup_workers, or use a new --state_dir"));
    }
    map_ = state->map();
    next_node_id_ = std::max<NodeId>(1, state->next_node_id());
    next_table_id_ = std::max<TableId>(1, state->next_table_id());
    next_checkpoint_id_ = std::max<uint64_t>(1, state->next_checkpoint_id());
    restoring_ = state->restoring();
    restored_from_ = state->restored_from();
    restored_clock_ = state->restored_clock();
    rolled_back_.insert(state->rolled_back_workers().begin(),
                        state->rolled_back_workers().end());
    for (const std::string& b : state->passed_barriers()) {
      if (passed_barriers_.size() < kMaxPassedBarriers)
        passed_barriers_.insert(b);
    }
    roster_.Import(state->roster());
    for (const auto& t : state->pending_tables()) {
      if (FindTableById(t.id()) == nullptr) continue;
      auto p = std::make_shared<PendingTable>();
      p->id = t.id();
      p->name = t.name();
      p->epoch = t.epoch();
      p->waiting.assign(t.waiting().begin(), t.waiting().end());
      pending_[p->id] = std::move(p);
    }
    for (const auto& r : state->refusals()) {
      if (FindTableById(r.table()) != nullptr) {
        refused_.insert({r.node(), r.table()});
      }
    }
    for (const auto& r : state->ranks()) {
      if (r.rank() < 0 || r.rank() >= clocks_.size()) continue;
      rank_of_[r.node()] = r.rank();
      rank_holder_[r.rank()] = r.node();
    }
    manifests_ = std::move(manifests);
    if (!manifests_.empty()) last_checkpoint_clock_ = manifests_.back().clock();
    // Clocks written before the last restore are not the job's any more.
    if (clocks.restored_from() == restored_from_) {
      for (int r = 0; r < clocks.workers_size() && r < clocks_.size(); ++r) {
        const proto::WorkerStatus& w = clocks.workers(r);
        if (clocks_.Restore(r, w.clock()).ok()) workers_[r] = w;
        workers_[r].set_rank(r);
      }
    } else if (const proto::CheckpointManifest* m =
                   FindManifest(restored_from_)) {
      SetClocks(*m);
    }
    // The roster on disk is newer than the clocks (it is synced).
    for (int r = 0; r < clocks_.size(); ++r) {
      workers_[r].set_lost(roster_.lost(r));
      workers_[r].set_retired(roster_.retired(r));
      if (roster_.finished(r)) workers_[r].set_finished(true);
      if (roster_.retired(r)) clocks_.Retire(r);
    }
    // Every node gets a full dead_after to be heard from.
    const absl::Time now = absl::Now();
    for (const auto& n : map_.nodes()) {
      if (n.state() != proto::ALIVE) continue;
      last_seen_[n.id()] = now;
      if (n.role() == proto::SERVER) unconfirmed_.insert(n.id());
    }
    version_ = durable_version_ = 1;
    published_ = map_;
    DP_LOG(INFO) << "recovered state from " << options_.state_dir << ": epoch "
                 << map_.epoch() << ", " << map_.nodes_size() << " nodes, "
                 << map_.tables_size() << " tables, " << manifests_.size()
                 << " checkpoints"
                 << (manifests_.empty()
                         ? std::string()
                         : absl::StrCat(" (newest ", manifests_.back().id(),
                                        " at clock ", manifests_.back().clock(),
                                        ")"))
                 << ", gating clock " << clocks_.GatingClock()
                 << (restoring_ != 0
                         ? absl::StrCat("; resuming the restore of checkpoint ",
                                        restoring_)
                         : std::string());
    return absl::OkStatus();
  }

  // Writes each new version of the state (synced; only the newest of those
  // queued meanwhile), then publishes its map; and the clocks, at most
  // every 300 ms, unsynced. Runs until shutdown, after a last write.
  void PersistLoop() ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    absl::Time clocks_saved = absl::InfinitePast();
    absl::Time retry_at = absl::InfinitePast();
    bool logged = false;
    while (true) {
      auto work = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return stopping_ || version_ > durable_version_;
      };
      mu_.AwaitWithTimeout(absl::Condition(&work), absl::Milliseconds(100));
      if (version_ > durable_version_ && absl::Now() >= retry_at) {
        const uint64_t v = version_;
        const std::string bytes = Snapshot().SerializeAsString();
        proto::ClusterMap map = map_;
        mu_.Unlock();
        absl::Status s = store_->SaveState(bytes);  // not under the lock
        mu_.Lock();
        if (s.ok()) {
          durable_version_ = std::max(durable_version_, v);
          if (map.epoch() >= published_.epoch()) published_ = std::move(map);
          if (logged) DP_LOG(INFO) << "state written again";
          store_error_ = absl::OkStatus();
          logged = false;
        } else {
          store_error_ = s;
          retry_at = absl::Now() + absl::Milliseconds(500);
          if (!logged) DP_LOG(ERROR) << "cannot write the state: " << s;
          logged = true;
          if (stopping_) break;
        }
      }
      const absl::Time now = absl::Now();
      if (clocks_dirty_ &&
          (stopping_ || now - clocks_saved >= absl::Milliseconds(300))) {
        clocks_dirty_ = false;
        clocks_saved = now;
        const proto::SchedulerClocks clocks = ClocksSnapshot();
        mu_.Unlock();
        absl::Status s = store_->SaveClocks(clocks);
        mu_.Lock();
        if (!s.ok()) DP_LOG(WARNING) << "cannot write the clocks: " << s;
      }
      if (stopping_ && version_ <= durable_version_ && !clocks_dirty_) break;
    }
  }

  // --- Checkpoints and restores ---

  struct CheckpointWaiter {
    proto::LbfgsState lbfgs;  // the caller's, if a coordinator
    bool done = false;
    absl::StatusOr<proto::CheckpointManifest> result =
        absl::UnknownError("not run");
  };

  const proto::CheckpointManifest* FindManifest(uint64_t id) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    for (const auto& m : manifests_) {
      if (m.id() == id) return &m;
    }
    return nullptr;
  }
  const proto::NodeInfo* FindByName(const std::string& name,
                                    proto::NodeRole role) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    for (const auto& n : map_.nodes()) {
      if (n.name() == name && n.role() == role) return &n;
    }
    return nullptr;
  }
  std::vector<CheckpointServer> LiveServers() const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    std::vector<CheckpointServer> out;
    for (const proto::NodeInfo* n : AliveServers()) {
      out.push_back({n->id(), n->name(), n->admin_address()});
    }
    return out;
  }
  // The workers' clocks and progress as a manifest recorded them.
  void SetClocks(const proto::CheckpointManifest& m)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    clocks_ = ClockTable(options_.policy);
    for (auto& w : workers_) w = proto::WorkerStatus();
    for (int r = 0; r < clocks_.size(); ++r) workers_[r].set_rank(r);
    for (const proto::WorkerStatus& w : m.workers()) {
      if (w.rank() < 0 || w.rank() >= clocks_.size()) continue;
      if (clocks_.Restore(w.rank(), w.clock()).ok()) workers_[w.rank()] = w;
    }
    // A rank the job went on without stays out of the gate: the roster
    // refuses a replacement for it, so nothing would ever advance it.
    for (int r = 0; r < clocks_.size(); ++r) {
      workers_[r].set_lost(roster_.lost(r));
      workers_[r].set_retired(roster_.retired(r));
      if (roster_.retired(r)) clocks_.Retire(r);
    }
    clocks_dirty_ = true;
  }

  void DurabilityLoop() ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    const absl::Duration every = options_.checkpoint_every;
    absl::Time next_periodic = every > absl::ZeroDuration()
                                   ? absl::Now() + every
                                   : absl::InfiniteFuture();
    absl::Time not_before = absl::InfinitePast();
    while (!stopping_) {
      auto work = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return stopping_ || restoring_ != 0 || !checkpoint_requests_.empty();
      };
      mu_.AwaitWithTimeout(absl::Condition(&work), absl::Milliseconds(100));
      if (stopping_) break;
      if (restoring_ != 0) {
        RunRestore();
        continue;
      }
      const absl::Time now = absl::Now();
      bool due = !checkpoint_requests_.empty();
      if (!due && now >= not_before && map_.tables_size() > 0 &&
          WorkersHeldBack().empty()) {
        due = now >= next_periodic ||
              (options_.checkpoint_every_clocks > 0 &&
               clocks_.GatingClock() >=
                   last_checkpoint_clock_ + options_.checkpoint_every_clocks);
      }
      if (!due) continue;
      std::deque<std::shared_ptr<CheckpointWaiter>> waiting;
      waiting.swap(checkpoint_requests_);
      // One coordinator per job: the newest state asked for, if any.
      proto::LbfgsState lbfgs;
      for (const auto& w : waiting) {
        if (!w->lbfgs.table().empty()) lbfgs = w->lbfgs;
      }
      absl::StatusOr<proto::CheckpointManifest> result = TakeCheckpoint(lbfgs);
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
    for (auto& w : checkpoint_requests_) {
      w->result = absl::UnavailableError("scheduler shutting down");
      w->done = true;
    }
    checkpoint_requests_.clear();
  }

  // One checkpoint, retried (with a new id) while a part passed the cut
  // clock. Releases the lock while the servers work.
  absl::StatusOr<proto::CheckpointManifest> TakeCheckpoint(
      const proto::LbfgsState& lbfgs) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    const absl::Time start = absl::Now();
    const absl::Time deadline = start + options_.checkpoint_timeout;
    absl::Status last = absl::DeadlineExceededError("no attempt");
    for (int attempt = 0; attempt < 8 && absl::Now() < deadline; ++attempt) {
      if (stopping_) return absl::UnavailableError("scheduler shutting down");
      if (restoring_ != 0) {
        return absl::FailedPreconditionError(absl::StrCat(
            "a restore from checkpoint ", restoring_, " is running"));
      }
      CheckpointPlan plan;
      // The id is on disk before any server writes under it.
      plan.id = next_checkpoint_id_++;
      DP_RETURN_IF_ERROR(AwaitDurable(Commit()), "checkpoint");
      plan.servers = LiveServers();
      for (const auto& t : map_.tables()) plan.tables.push_back(t.spec());
      plan.bsp = options_.policy.kind == ConsistencyPolicy::Kind::kBsp;
      // After a part passed the cut, the job is moving: wait for its step.
      plan.clock_offset = attempt > 0 ? 1 : 0;
      plan.deadline = deadline;
      plan.auth = options_.auth;
      // Clocks before the cut: every update below them is in it.
      const proto::SchedulerClocks clocks = ClocksSnapshot();
      const int64_t gating = clocks_.GatingClock();
      mu_.Unlock();
      absl::StatusOr<proto::CheckpointManifest> m =
          RunCheckpoint(plan, &admins_);
      absl::Status saved = m.status();
      if (m.ok()) {
        *m->mutable_job() = job_;
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
        saved = store_->SaveManifest(*m);
      }
      mu_.Lock();
      if (saved.ok()) {
        manifests_.push_back(*m);
        last_checkpoint_clock_ = m->clock();
        std::vector<uint64_t> old;
        const size_t keep = std::max(1, options_.keep_checkpoints);
        while (manifests_.size() > keep) {
          old.push_back(manifests_.front().id());
          manifests_.erase(manifests_.begin());
        }
        proto::DropCheckpointsRequest drop;
        drop.set_keep_from(manifests_.front().id());
        drop.set_completed(m->id());
        const std::vector<CheckpointServer> servers = LiveServers();
        mu_.Unlock();
        for (uint64_t id : old) {
          absl::Status s = store_->DeleteManifest(id);
          if (!s.ok()) DP_LOG(WARNING) << s;
        }
        DropCheckpoints(servers, drop, &admins_);
        mu_.Lock();
        DP_LOG(INFO) << "checkpoint " << m->id() << " complete: clock "
                     << m->clock() << ", " << m->tables_size() << " tables, "
                     << m->rows() << " rows, " << m->bytes() << " bytes in "
                     << m->duration_ms() << " ms";
        return *m;
      }
      last = saved;
      proto::DropCheckpointsRequest drop;
      drop.add_drop(plan.id);
      mu_.Unlock();
      DropCheckpoints(plan.servers, drop, &admins_);
      mu_.Lock();
      if (last.code() != absl::StatusCode::kAborted) return last;
      DP_LOG(INFO) << "checkpoint " << plan.id << ": " << last
                   << "; trying again";
    }
    return last;
  }

  // Rolls the job back to checkpoint restoring_ (see scheduler.h). Returns
  // with the restore done, failed (then an older checkpoint is tried, or
  // the ranges stay lost), or the scheduler stopping.
  void RunRestore() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    const uint64_t id = restoring_;
    const proto::CheckpointManifest* found = FindManifest(id);
    if (found == nullptr) {
      DP_LOG(ERROR) << "restore: checkpoint " << id << " has no manifest";
      restoring_ = 0;
      Commit();
      return;
    }
    const proto::CheckpointManifest m = *found;
    const std::vector<std::string> names = ServersOf(m);
    // 1. Every server the checkpoint names, registered.
    auto all_alive = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      if (stopping_) return true;
      for (const std::string& name : names) {
        const proto::NodeInfo* n = FindByName(name, proto::SERVER);
        if (n == nullptr || n->state() != proto::ALIVE) return false;
      }
      return true;
    };
    while (!mu_.AwaitWithTimeout(absl::Condition(&all_alive),
                                 options_.restore_wait)) {
      DP_LOG(WARNING) << "restore of checkpoint " << id << ": "
                      << WorkersHeldBack()
                      << " (a checkpoint restores only onto the servers "
                      << "whose data dirs hold it, by name)";
    }
    if (stopping_) return;
    // 2. The checkpoint's tables and ranges, each on the server holding
    // its rows, lost until loaded.
    if (restore_epoch_ == 0) {
      map_.clear_tables();
      for (const auto& t : m.tables()) {
        proto::TableMap* table = map_.add_tables();
        *table->mutable_spec() = t.spec();
        next_table_id_ = std::max<TableId>(next_table_id_, t.spec().id() + 1);
        for (const auto& r : t.ranges()) {
          proto::RangeAssignment* a = table->add_ranges();
          a->set_begin(r.begin());
          a->set_end(r.end());
          a->set_primary(FindByName(r.server(), proto::SERVER)->id());
          a->set_lost(true);
        }
      }
      BumpEpoch();
      restore_epoch_ = map_.epoch();
      DP_LOG(INFO) << "restore of checkpoint " << id << " (clock " << m.clock()
                   << ") over " << names.size() << " servers, epoch "
                   << restore_epoch_;
      if (!AwaitDurable(Commit()).ok()) return;  // tried again next round
    }
    // 3. Each server loads its ranges, in parallel.
    std::vector<absl::Status> results(names.size());
    std::vector<uint64_t> loaded_incarnation(names.size(), 0);
    mu_.Unlock();
    std::vector<std::thread> threads;
    for (size_t i = 0; i < names.size(); ++i) {
      threads.emplace_back([&, i] {
        results[i] = RestoreServer(m, names[i], &loaded_incarnation[i]);
      });
    }
    for (auto& t : threads) t.join();
    mu_.Lock();
    if (stopping_) return;
    for (size_t i = 0; i < names.size(); ++i) {
      const proto::NodeInfo* n = FindByName(names[i], proto::SERVER);
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
      Commit();
      return;
    }
    // 4. Serve them again, at the checkpoint's clocks.
    for (auto& t : *map_.mutable_tables()) {
      for (auto& r : *t.mutable_ranges()) r.set_lost(false);
    }
    RefillWithinRoom();
    SetClocks(m);
    // Workers still running belong to the job before the rollback: they
    // must register again, and get the checkpoint's clock.
    for (const auto& n : map_.nodes()) {
      if (n.role() == proto::WORKER) rolled_back_.insert(n.id());
    }
    restored_from_ = id;
    ++restores_completed_;
    restored_clock_ = m.clock();
    last_checkpoint_clock_ = m.clock();
    restoring_ = 0;
    restore_epoch_ = 0;
    BumpEpoch();
    DP_LOG(INFO) << "restored checkpoint " << id << ": the job resumes at "
                 << "clock " << m.clock() << ", epoch " << map_.epoch();
    AwaitDurable(Commit()).IgnoreError();
  }

  // Has server `name` load its ranges of `m`, retrying while it is down or
  // behind on the map; its incarnation when it did.
  absl::Status RestoreServer(const proto::CheckpointManifest& m,
                             const std::string& name, uint64_t* incarnation)
      ABSL_LOCKS_EXCLUDED(mu_) {
    proto::RestoreRequest req;
    req.set_checkpoint_id(m.id());
    for (const auto& r : RangesOf(m, name)) *req.add_ranges() = r;
    const absl::Duration timeout =
        std::max(absl::Minutes(10), options_.checkpoint_timeout);
    req.set_timeout_ms(absl::ToInt64Milliseconds(timeout));
    while (true) {
      std::string address;
      {
        absl::MutexLock lock(&mu_);
        auto ready = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
          if (stopping_) return true;
          const proto::NodeInfo* n = FindByName(name, proto::SERVER);
          return n != nullptr && n->state() == proto::ALIVE &&
                 applied_[n->id()] >= restore_epoch_;
        };
        mu_.AwaitWithTimeout(absl::Condition(&ready), absl::Seconds(1));
        if (stopping_) return absl::UnavailableError("scheduler stopping");
        if (!ready()) continue;
        const proto::NodeInfo* n = FindByName(name, proto::SERVER);
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

  const SchedulerOptions options_;
  AdminClients admins_;
  int port_ = 0;
  std::unique_ptr<HealthService> health_;  // outlives server_
  std::unique_ptr<grpc::Server> server_;
  std::thread sweeper_;

  mutable absl::Mutex mu_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  bool stopped_ ABSL_GUARDED_BY(mu_) = false;
  proto::ClusterMap map_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<NodeId, absl::Time> last_seen_ ABSL_GUARDED_BY(mu_);
  // When the handovers under way began (CancelSlowHandOvers).
  absl::Time handover_started_ ABSL_GUARDED_BY(mu_) = absl::InfiniteFuture();
  // Nodes reported unreachable: since when, and why.
  absl::flat_hash_map<NodeId, std::pair<absl::Time, std::string>> suspect_since_
      ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<NodeId, Epoch> applied_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, BarrierState> barriers_ ABSL_GUARDED_BY(mu_);
  static constexpr size_t kMaxPassedBarriers = 64;
  absl::btree_set<std::string> passed_barriers_ ABSL_GUARDED_BY(mu_);
  NodeId next_node_id_ ABSL_GUARDED_BY(mu_) = 1;
  proto::JobConfig job_;  // immutable after construction
  ClockTable clocks_ ABSL_GUARDED_BY(mu_);
  WorkerRoster roster_ ABSL_GUARDED_BY(mu_);
  std::vector<proto::WorkerStatus> workers_ ABSL_GUARDED_BY(mu_);
  // Workers' ranks, both ways; a rank is held by at most one node.
  absl::flat_hash_map<NodeId, int> rank_of_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<int, NodeId> rank_holder_ ABSL_GUARDED_BY(mu_);
  TableId next_table_id_ ABSL_GUARDED_BY(mu_) = 1;

  // State on disk (null without a state dir).
  std::unique_ptr<StateStore> store_;
  std::thread persister_;
  std::thread durability_;
  // Versions of the state: changed in memory, on disk (and published).
  uint64_t version_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t durable_version_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Status store_error_ ABSL_GUARDED_BY(mu_);
  // The map as on disk: what nodes and clients see.
  proto::ClusterMap published_ ABSL_GUARDED_BY(mu_);
  bool clocks_dirty_ ABSL_GUARDED_BY(mu_) = false;
  // Servers recovered as ALIVE that have not been heard from since.
  std::set<NodeId> unconfirmed_ ABSL_GUARDED_BY(mu_);

  // Checkpoints: complete ones (oldest first), requests waiting.
  std::vector<proto::CheckpointManifest> manifests_ ABSL_GUARDED_BY(mu_);
  std::deque<std::shared_ptr<CheckpointWaiter>> checkpoint_requests_
      ABSL_GUARDED_BY(mu_);
  uint64_t next_checkpoint_id_ ABSL_GUARDED_BY(mu_) = 1;
  int64_t last_checkpoint_clock_ ABSL_GUARDED_BY(mu_) = 0;
  // The checkpoint being restored (0: none) and the epoch of its map.
  uint64_t restoring_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t restores_completed_ ABSL_GUARDED_BY(mu_) = 0;  // by this process
  Epoch restore_epoch_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t restored_from_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t restored_clock_ ABSL_GUARDED_BY(mu_) = 0;
  // Workers not registered since the last restore (SchedulerState).
  absl::flat_hash_set<NodeId> rolled_back_ ABSL_GUARDED_BY(mu_);
  SchedulerEvents events_ ABSL_GUARDED_BY(mu_);
  MetricsRegistry::Registration metrics_;
  // Tables being declared, by id.
  absl::flat_hash_map<TableId, std::shared_ptr<PendingTable>> pending_
      ABSL_GUARDED_BY(mu_);
  // (server, table) pairs the server reported it cannot hold: never chosen
  // as a backup for that table (until the server registers again).
  absl::flat_hash_set<std::pair<NodeId, TableId>> refused_ ABSL_GUARDED_BY(mu_);
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
