#include "scheduler/scheduler.h"

#include <algorithm>
#include <limits>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
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
#include "scheduler/placement.h"
#include "scheduler/request_checks.h"

namespace downpour {
namespace {

// Named vectors per table: enough for L-BFGS with a history of 30.
constexpr int kMaxTableVectors = 64;

absl::Status BadSpec(const proto::TableSpec& spec, absl::string_view why) {
  return absl::InvalidArgumentError(
      absl::StrCat("table '", spec.name(), "': ", why));
}

// The checks that need no servers: name, kind, width, key count and the
// initializer. kInvalidArgument.
absl::Status ValidateShape(const proto::TableSpec& spec) {
  if (spec.name().empty()) return BadSpec(spec, "empty name");
  if (spec.kind() != proto::DENSE && spec.kind() != proto::SPARSE) {
    return BadSpec(spec, "kind must be DENSE or SPARSE");
  }
  if (spec.width() < 1 || spec.width() > (1u << 20)) {
    return BadSpec(spec,
                   absl::StrCat("width ", spec.width(), " not in [1, 2^20]"));
  }
  if (spec.kind() == proto::DENSE && spec.num_keys() == 0) {
    return BadSpec(spec, "a dense table needs num_keys >= 1");
  }
  if (spec.kind() == proto::SPARSE && spec.num_keys() != 0) {
    return BadSpec(spec,
                   "a sparse table spans the whole key space; leave num_keys 0");
  }
  if (spec.vectors_size() > 0) {
    // Named vectors exist for server-side algebra over contiguous ranges.
    if (spec.kind() != proto::DENSE) {
      return BadSpec(spec, "named vectors need a dense table");
    }
    if (spec.vectors_size() > kMaxTableVectors) {
      return BadSpec(spec, absl::StrCat(spec.vectors_size(),
                                        " named vectors, at most ",
                                        kMaxTableVectors));
    }
    absl::flat_hash_set<std::string> names;
    for (const std::string& v : spec.vectors()) {
      if (v.empty()) return BadSpec(spec, "a named vector without a name");
      if (!names.insert(v).second) {
        return BadSpec(spec, absl::StrCat("vector '", v, "' named twice"));
      }
    }
  }
  const auto& init = spec.init();
  if (init.kind() == proto::InitializerSpec::UNIFORM &&
      init.high() < init.low()) {
    return BadSpec(spec, "uniform initializer with high < low");
  }
  if (init.kind() == proto::InitializerSpec::NORMAL && init.stddev() < 0) {
    return BadSpec(spec, "normal initializer with stddev < 0");
  }
  return absl::OkStatus();
}

// The whole check of a new table: its shape, then its update handler against
// `plugin_names`, the plugins every live server has loaded.
absl::Status ValidateSpec(const proto::TableSpec& spec,
                          const std::vector<std::string>& plugin_names) {
  DP_RETURN_IF_ERROR(ValidateShape(spec));
  // The one call site of the handler check (//handlers).
  DP_RETURN_IF_ERROR(ValidateHandlerSpec(spec.handler(), plugin_names),
                     "table '", spec.name(), "'");
  return absl::OkStatus();
}

class SchedulerImpl final : public Scheduler, public proto::Scheduler::Service {
 public:
  explicit SchedulerImpl(const SchedulerOptions& o)
      : options_(o), clocks_(o.policy) {
    o.policy.ToJob(&job_);
    workers_.resize(clocks_.size());
    for (int r = 0; r < clocks_.size(); ++r) workers_[r].set_rank(r);
  }
  ~SchedulerImpl() override { Shutdown(); }

  absl::Status Start() {
    DP_ASSIGN_OR_RETURN(
        StartedGrpcServer started,
        StartGrpcServer(options_.listen_address, this, "the scheduler"));
    health_ = std::move(started.health);
    server_ = std::move(started.server);
    port_ = started.port;
    sweeper_ = std::thread([this] { SweepLoop(); });
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
    if (sweeper_.joinable()) sweeper_.join();
    // Streams and barriers notice stopping_ within their wait slice.
    if (server_) {
      server_->Shutdown(std::chrono::system_clock::now() +
                        std::chrono::seconds(2));
    }
    absl::MutexLock lock(&mu_);
    stopped_ = true;
  }

  proto::ClusterMap CurrentMap() const override {
    absl::MutexLock lock(&mu_);
    return map_;
  }

  // --- gRPC service ---

  grpc::Status Register(grpc::ServerContext* ctx, const proto::RegisterRequest* req,
                        proto::RegisterReply* reply) override {
    if (grpc::Status a = options_.auth.Check(ctx); !a.ok()) return a;
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
    proto::NodeInfo* node = nullptr;
    if (!req->name().empty()) {
      for (auto& n : *map_.mutable_nodes()) {
        if (n.name() == req->name() && n.role() == req->role()) node = &n;
      }
    }
    if (absl::Status s = CheckRoomForNode(*req, node); !s.ok()) return Err(s);
    if (node != nullptr && node->state() == proto::ALIVE) {
      if (req->incarnation() == 0 ||
          req->incarnation() == node->incarnation()) {
        return Err(absl::AlreadyExistsError(
            absl::StrCat("register: node '", req->name(),
                         "' is alive as id ", node->id())));
      }
      // The same name from a new process: the old one is gone (a pod
      // restarted faster than its heartbeats expired). Fail it over now.
      DP_LOG(WARNING) << "node '" << req->name() << "' (id " << node->id()
                      << ") registered again from a new process; the old "
                      << "one is declared dead";
      node->set_state(proto::DEAD);
      if (node->role() == proto::SERVER) RemoveServer(&map_, node->id());
    }
    // A server registering again as a new process has lost its memory.
    const bool new_incarnation =
        node != nullptr && node->role() == proto::SERVER &&
        req->incarnation() != node->incarnation();
    int rank = -1;
    if (req->role() == proto::WORKER) {
      absl::StatusOr<int> granted = GrantRank(*req, node);
      if (!granted.ok()) return Err(granted.status());
      rank = *granted;
    }
    if (node == nullptr) {
      node = map_.add_nodes();
      node->set_id(next_node_id_++);
    }
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
    applied_[node->id()] = 0;
    if (new_incarnation && ForgetServerData(&map_, node->id())) {
      DP_LOG(WARNING) << "server '" << req->name() << "' (id " << node->id()
                      << ") restarted: ranges only it held are lost";
    }
    if (req->role() == proto::SERVER) RefillWithinRoom();
    ResolvePending();
    BumpEpoch();
    DP_LOG(INFO) << proto::NodeRole_Name(req->role()) << " '" << req->name()
                 << "' registered as node " << node->id() << " ("
                 << req->data_endpoint() << "), epoch " << map_.epoch();
    reply->set_node_id(node->id());
    reply->set_heartbeat_interval_ms(
        absl::ToInt64Milliseconds(options_.heartbeat_interval));
    *reply->mutable_map() = map_;
    return grpc::Status::OK;
  }

  grpc::Status Heartbeat(grpc::ServerContext* ctx, const proto::HeartbeatRequest* req,
                         proto::HeartbeatReply* reply) override {
    if (grpc::Status a = options_.auth.Check(ctx); !a.ok()) return a;
    absl::MutexLock lock(&mu_);
    proto::NodeInfo* node = FindNode(req->node_id());
    if (node == nullptr) {
      return Err(absl::NotFoundError(absl::StrCat("unknown node ", req->node_id())));
    }
    if (node->state() == proto::DEAD) {
      return Err(absl::FailedPreconditionError(absl::StrCat(
          "node ", req->node_id(), " was declared dead; register again")));
    }
    last_seen_[node->id()] = absl::Now();
    RecordApplied(node->id(), req->applied_epoch());
    ResolvePending();
    reply->set_epoch(map_.epoch());
    return grpc::Status::OK;
  }

  grpc::Status AckEpoch(grpc::ServerContext* ctx, const proto::AckEpochRequest* req,
                        proto::AckEpochReply*) override {
    if (grpc::Status a = options_.auth.Check(ctx); !a.ok()) return a;
    if (absl::Status s = CheckTableFailures(*req); !s.ok()) return Err(s);
    absl::MutexLock lock(&mu_);
    if (FindNode(req->node_id()) == nullptr) {
      return Err(absl::NotFoundError(absl::StrCat("unknown node ", req->node_id())));
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

  grpc::Status GetClusterMap(grpc::ServerContext* ctx, const proto::GetClusterMapRequest*,
                             proto::ClusterMap* map) override {
    if (grpc::Status a = options_.auth.Check(ctx); !a.ok()) return a;
    absl::MutexLock lock(&mu_);
    *map = map_;
    return grpc::Status::OK;
  }

  grpc::Status WatchClusterMap(grpc::ServerContext* ctx,
                               const proto::WatchClusterMapRequest* req,
                               grpc::ServerWriter<proto::ClusterMap>* writer) override {
    if (grpc::Status a = options_.auth.Check(ctx); !a.ok()) return a;
    Epoch known = req->known_epoch();
    bool broken = false;
    while (!(broken = ctx->IsCancelled())) {
      proto::ClusterMap map;
      {
        absl::MutexLock lock(&mu_);
        auto changed = [this, known]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
          return stopping_ || map_.epoch() > known;
        };
        // Short slices: a stream that breaks is how a killed node first
        // shows, and failover waits for it.
        mu_.AwaitWithTimeout(absl::Condition(&changed), absl::Milliseconds(50));
        if (stopping_) break;
        if (map_.epoch() <= known) continue;
        map = map_;
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

  grpc::Status CreateTable(grpc::ServerContext* ctx, const proto::CreateTableRequest* req,
                           proto::CreateTableReply* reply) override {
    if (grpc::Status a = options_.auth.Check(ctx); !a.ok()) return a;
    if (absl::Status s = CheckTableStrings(req->spec()); !s.ok()) return Err(s);
    return Err(DoCreateTable(*req, reply));
  }

  grpc::Status AdvanceClock(grpc::ServerContext* ctx,
                            const proto::AdvanceClockRequest* req,
                            proto::AdvanceClockReply* reply) override {
    if (grpc::Status a = options_.auth.Check(ctx); !a.ok()) return a;
    absl::MutexLock lock(&mu_);
    if (absl::Status s = CheckRankHolder("advance clock", req->node_id(),
                                         req->rank());
        !s.ok()) {
      return Err(s);
    }
    if (req->clock() >= clocks_.clock(req->rank()) &&
        !clocks_.WithinBound(req->rank(), req->clock(), options_.clock_report_slack)) {
      // Ahead of what the others reported: their reports may still be on
      // the way, so wait a little before refusing.
      auto within = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return stopping_ || clocks_.WithinBound(req->rank(), req->clock(), options_.clock_report_slack);
      };
      mu_.AwaitWithTimeout(absl::Condition(&within),
                           std::min(options_.clock_report_grace,
                                    TimeLeft(ctx) - absl::Milliseconds(100)));
      if (stopping_) return Err(absl::UnavailableError("scheduler shutting down"));
    }
    absl::Status s = clocks_.Advance(req->rank(), req->clock(), options_.clock_report_slack);
    if (!s.ok()) {
      return Err(Annotate(s, absl::StrCat("advance clock of rank ",
                                          req->rank(), " from node ",
                                          req->node_id())));
    }
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
      if (r != req->rank()) others = std::min(others, clocks_.clock(r));
    }
    reply->set_others_min_clock(others);
    return grpc::Status::OK;
  }

  grpc::Status WaitClock(grpc::ServerContext* ctx, const proto::WaitClockRequest* req,
                         proto::WaitClockReply* reply) override {
    if (grpc::Status a = options_.auth.Check(ctx); !a.ok()) return a;
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
      return stopping_ || clocks_.MayProceed(req->clock());
    };
    if (!mu_.AwaitWithTimeout(absl::Condition(&may), *timeout)) {
      return Err(absl::DeadlineExceededError(absl::StrCat(
          "worker ", req->rank(), " at clock ", req->clock(),
          " still blocked by gating clock ", clocks_.GatingClock(), " (",
          clocks_.policy().ToString(), ")")));
    }
    if (stopping_) return Err(absl::UnavailableError("scheduler shutting down"));
    reply->set_gating_clock(clocks_.GatingClock());
    return grpc::Status::OK;
  }

  grpc::Status GetJobStatus(grpc::ServerContext* ctx, const proto::JobStatusRequest*,
                            proto::JobStatus* status) override {
    if (grpc::Status a = options_.auth.Check(ctx); !a.ok()) return a;
    absl::MutexLock lock(&mu_);
    *status->mutable_job() = job_;
    status->set_gating_clock(clocks_.GatingClock());
    for (const auto& w : workers_) *status->add_workers() = w;
    return grpc::Status::OK;
  }

  grpc::Status ReplicaReady(grpc::ServerContext* ctx,
                            const proto::ReplicaReadyRequest* req,
                            proto::ReplicaReadyReply*) override {
    if (grpc::Status a = options_.auth.Check(ctx); !a.ok()) return a;
    absl::MutexLock lock(&mu_);
    absl::Status s = MarkInSync(&map_, req->table_id(), req->range_begin(),
                                req->primary(), req->backup());
    if (!s.ok()) return Err(s);
    BumpEpoch();
    DP_LOG(INFO) << "table " << req->table_id() << " range from key "
                 << req->range_begin() << ": backup " << req->backup()
                 << " in sync, epoch " << map_.epoch();
    return grpc::Status::OK;
  }

  grpc::Status ReportUnreachable(grpc::ServerContext* ctx,
                                 const proto::ReportUnreachableRequest* req,
                                 proto::ReportUnreachableReply*) override {
    if (grpc::Status a = options_.auth.Check(ctx); !a.ok()) return a;
    absl::MutexLock lock(&mu_);
    Suspect(req->suspect(), absl::StrCat("node ", req->reporter(), ": ",
                                         Printable(req->reason(), 200)));
    return grpc::Status::OK;
  }

  grpc::Status Barrier(grpc::ServerContext* ctx, const proto::BarrierRequest* req,
                       proto::BarrierReply* reply) override {
    if (grpc::Status a = options_.auth.Check(ctx); !a.ok()) return a;
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
      return Err(absl::ResourceExhaustedError(absl::StrCat(
          "barrier '", req->name(), "': ", barriers_.size(),
          " barriers are open already")));
    }
    BarrierState& b = barriers_[req->name()];
    const uint64_t generation = b.generation;
    b.arrived.insert(req->node_id());
    if (b.arrived.size() >= req->count()) {
      b.arrived.clear();
      b.generation++;
      ForgetBarrierIfIdle(req->name());
      reply->set_arrived(req->count());
      return grpc::Status::OK;
    }
    ++b.waiters;
    // `b` may move while the lock is released: look it up again.
    auto released = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return stopping_ || barriers_[req->name()].generation != generation;
    };
    const bool in_time =
        mu_.AwaitWithTimeout(absl::Condition(&released), *timeout);
    BarrierState& after = barriers_[req->name()];
    --after.waiters;
    if (!in_time) {
      after.arrived.erase(req->node_id());
      const size_t arrived = after.arrived.size() + 1;
      ForgetBarrierIfIdle(req->name());
      return Err(absl::DeadlineExceededError(absl::StrCat(
          "barrier '", req->name(), "': ", arrived, " of ", req->count(),
          " arrived in time")));
    }
    ForgetBarrierIfIdle(req->name());
    if (stopping_) return Err(absl::UnavailableError("scheduler shutting down"));
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
    const auto old = node == nullptr ? rank_of_.end() : rank_of_.find(node->id());
    int want = -1;
    if (req.has_requested_rank()) {
      want = req.requested_rank();
      if (want < 0 || want >= size) {
        return absl::InvalidArgumentError(absl::StrCat(
            "register: worker '", req.name(), "' asks for rank ", want,
            ", outside the job's ranks [0, ", size,
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
      return absl::AlreadyExistsError(absl::StrCat(
          "register: worker '", req.name(),
          "' lost its rank to another worker while it was dead"));
    } else {
      for (int r = 0; r < size && want < 0; ++r) {
        if (!rank_holder_.contains(r)) want = r;
      }
      if (want < 0) {
        return absl::ResourceExhaustedError(absl::StrCat(
            "register: the job has ", size, " workers already"));
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
      if (n.role() == proto::SERVER && n.state() == proto::ALIVE) out.push_back(&n);
    }
    return out;
  }
  void RecordApplied(NodeId id, Epoch epoch) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    applied_[id] = std::max(applied_[id], epoch);
  }
  void BumpEpoch() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    map_.set_epoch(map_.epoch() + 1);
  }

  // A table that follows the job gets its enforcement from the job's
  // policy, the one rule for every table of the job; declaring it by hand
  // as well is kInvalidArgument, since it could contradict the job.
  absl::Status ApplyJobPolicy(proto::TableSpec* spec) const {
    if (!spec->follows_job()) return absl::OkStatus();
    if (spec->sync_workers() != 0 || spec->num_workers() != 0) {
      return BadSpec(
          *spec,
          absl::StrCat("follows the job's policy (", options_.policy.ToString(),
                       ") but sets sync_workers ", spec->sync_workers(),
                       " and num_workers ", spec->num_workers(),
                       " itself; leave both 0"));
    }
    spec->set_sync_workers(options_.policy.sync_workers());
    spec->set_num_workers(options_.policy.tracked_workers());
    return absl::OkStatus();
  }

  // The existing table named like `spec` (nullptr if none); kAlreadyExists
  // if its spec differs (ids aside).
  absl::StatusOr<const proto::TableMap*> FindTable(const proto::TableSpec& spec)
      const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
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
    DP_RETURN_IF_ERROR(ValidateShape(spec));
    absl::MutexLock lock(&mu_);
    // An existing table: OK once every server has it (an identical
    // declaration still pending waits for its outcome).
    auto existing_reply = [&](const proto::TableMap* t)
                              ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
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
      reply->set_epoch(map_.epoch());
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
      return absl::UnavailableError(absl::StrCat(
          "create table '", spec.name(), "': ", servers.size(),
          " live servers after ", absl::FormatDuration(timeout), ", need ",
          need));
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
      plugins.erase(std::remove_if(plugins.begin(), plugins.end(),
                                   [&](const std::string& p) { return !has.contains(p); }),
                    plugins.end());
    }
    DP_RETURN_IF_ERROR(ValidateSpec(spec, plugins));

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
    DP_LOG(INFO) << "table '" << spec.name() << "' (id " << spec.id() << ") over "
                 << table->ranges_size() << " ranges, " << options_.replicas
                 << " holders each, epoch " << epoch;
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
      if (n != nullptr && n->state() == proto::ALIVE && applied_[id] < p.epoch) {
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
  }

  // Server `node` reports that it cannot create or hold table
  // `f.table_id()`. A table still being declared is removed (all or
  // nothing); for a table in use, the server is taken off the ranges it
  // was catching up on and not chosen for that table again.
  void TableFailed(NodeId node, const proto::TableFailure& f)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    const proto::NodeInfo* n = FindNode(node);
    const std::string server =
        absl::StrCat("server ", node, " ('", n == nullptr ? "" : n->name(),
                     "')");
    const absl::Status why(static_cast<absl::StatusCode>(f.code()),
                           Printable(f.message(), kMaxFailureMessageBytes));
    if (auto p = pending_.find(f.table_id()); p != pending_.end()) {
      std::shared_ptr<PendingTable> pending = p->second;
      pending->failure = Annotate(
          why, absl::StrCat("table '", pending->name, "' not created: ",
                            server, " cannot create it"));
      Resolve(*pending);
      RemoveTable(f.table_id());
      BumpEpoch();
      DP_LOG(WARNING) << pending->failure << "; removed again, epoch "
                      << map_.epoch();
      return;
    }
    if (FindTableById(f.table_id()) == nullptr) return;  // removed already
    if (!refused_.insert({node, f.table_id()}).second) return;
    DP_LOG(WARNING) << server << " cannot hold table " << f.table_id()
                    << ": " << why;
    if (DropCatchingUp(&map_, f.table_id(), node)) {
      RefillWithinRoom();
      BumpEpoch();
      DP_LOG(WARNING) << server << " taken off the ranges of table "
                      << f.table_id() << " it was catching up on, epoch "
                      << map_.epoch();
    }
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
      return absl::ResourceExhaustedError(absl::StrCat(
          "register '", req.name(), "': the cluster lists ",
          map_.nodes_size(), " nodes, at most ", options_.max_nodes,
          " (dead ones are forgotten after ",
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
                          now - std::min(now, old),
                          entry.ByteSizeLong() + 16, options_.max_map_bytes);
  }

  // A clock call for `rank` from `node`: the rank exists and `node` holds
  // it (a DEAD holder keeps it until another worker takes it over).
  absl::Status CheckRankHolder(absl::string_view what, NodeId node,
                               int rank) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (rank < 0 || rank >= clocks_.size()) {
      return absl::InvalidArgumentError(absl::StrCat(
          what, ": rank ", rank, " outside the job's ranks [0, ",
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
    return absl::PermissionDeniedError(absl::StrCat(
        what, ": node ", node, " does not hold rank ", rank, " (", held,
        "); a worker reports only its own clock"));
  }

  // What is left of a call's deadline (long when it has none).
  static absl::Duration TimeLeft(const grpc::ServerContext* ctx) {
    const absl::Time deadline = absl::FromChrono(ctx->deadline());
    return std::max(absl::ZeroDuration(), deadline - absl::Now());
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
        n.set_state(proto::DEAD);
        dead.push_back(n.id());
        DP_LOG(WARNING) << "node " << n.id() << " ('" << n.name() << "') "
                        << why << "; declared dead";
      }
      const bool forgot = ForgetSilentNodes(now);
      if (dead.empty() && !forgot) continue;
      for (NodeId id : dead) {
        suspect_since_.erase(id);
        RemoveServer(&map_, id);
      }
      RefillWithinRoom();
      ResolvePending();
      BumpEpoch();
      DP_LOG(INFO) << "cluster map epoch " << map_.epoch();
    }
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
      if (client ? silent > options_.dead_after
                 : n.state() == proto::DEAD &&
                       silent > options_.forget_dead_after &&
                       !HoldsAnyRange(map_, n.id())) {
        gone.push_back(n.id());
      }
    }
    if (gone.empty()) return false;
    for (NodeId id : gone) {
      auto* nodes = map_.mutable_nodes();
      for (int i = 0; i < nodes->size(); ++i) {
        if (nodes->Get(i).id() != id) continue;
        DP_LOG(INFO) << proto::NodeRole_Name(nodes->Get(i).role()) << " "
                     << id << " ('" << nodes->Get(i).name()
                     << "') silent for long: forgotten";
        nodes->erase(nodes->begin() + i);
        break;
      }
      last_seen_.erase(id);
      applied_.erase(id);
      suspect_since_.erase(id);
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

  const SchedulerOptions options_;
  int port_ = 0;
  std::unique_ptr<HealthService> health_;  // outlives server_
  std::unique_ptr<grpc::Server> server_;
  std::thread sweeper_;

  mutable absl::Mutex mu_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  bool stopped_ ABSL_GUARDED_BY(mu_) = false;
  proto::ClusterMap map_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<NodeId, absl::Time> last_seen_ ABSL_GUARDED_BY(mu_);
  // Nodes reported unreachable: since when, and why.
  absl::flat_hash_map<NodeId, std::pair<absl::Time, std::string>>
      suspect_since_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<NodeId, Epoch> applied_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, BarrierState> barriers_ ABSL_GUARDED_BY(mu_);
  NodeId next_node_id_ ABSL_GUARDED_BY(mu_) = 1;
  proto::JobConfig job_;  // immutable after construction
  ClockTable clocks_ ABSL_GUARDED_BY(mu_);
  std::vector<proto::WorkerStatus> workers_ ABSL_GUARDED_BY(mu_);
  // Workers' ranks, both ways; a rank is held by at most one node.
  absl::flat_hash_map<NodeId, int> rank_of_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<int, NodeId> rank_holder_ ABSL_GUARDED_BY(mu_);
  TableId next_table_id_ ABSL_GUARDED_BY(mu_) = 1;
  // Tables being declared, by id.
  absl::flat_hash_map<TableId, std::shared_ptr<PendingTable>> pending_
      ABSL_GUARDED_BY(mu_);
  // (server, table) pairs the server reported it cannot hold: never chosen
  // as a backup for that table (until the server registers again).
  absl::flat_hash_set<std::pair<NodeId, TableId>> refused_
      ABSL_GUARDED_BY(mu_);
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
