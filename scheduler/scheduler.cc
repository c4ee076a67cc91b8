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
#include "scheduler/placement.h"
#include "scheduler/table_spec.h"
#include "scheduler/worker_roster.h"

namespace downpour {
namespace {

class SchedulerImpl final : public Scheduler, public proto::Scheduler::Service {
 public:
  explicit SchedulerImpl(const SchedulerOptions& o)
      : options_(o), clocks_(o.policy), roster_(o.policy, o.worker_loss) {
    o.policy.ToJob(&job_);
    workers_.resize(clocks_.size());
    for (int r = 0; r < clocks_.size(); ++r) workers_[r].set_rank(r);
  }
  ~SchedulerImpl() override { Shutdown(); }

  absl::Status Start() {
    DP_ASSIGN_OR_RETURN(
        StartedGrpcServer started,
        StartGrpcServer(options_.listen_address, this, "the scheduler",
                        options_.auth));
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
    if (req->role() == proto::ROLE_UNSPECIFIED) {
      return Err(absl::InvalidArgumentError("register: no role"));
    }
    if (req->role() == proto::SERVER && req->data_endpoint().empty()) {
      return Err(absl::InvalidArgumentError("register: a server needs a data endpoint"));
    }
    absl::MutexLock lock(&mu_);
    proto::NodeInfo* node = nullptr;
    if (!req->name().empty()) {
      for (auto& n : *map_.mutable_nodes()) {
        if (n.name() == req->name() && n.role() == req->role()) node = &n;
      }
    }
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
      if (absl::Status s = TakeOverRank(rank, req->name()); !s.ok()) {
        return Err(s);
      }
      reply->set_start_clock(clocks_.clock(rank));
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
    last_seen_[node->id()] = absl::Now();
    suspect_since_.erase(node->id());
    applied_[node->id()] = 0;
    if (new_incarnation && ForgetServerData(&map_, node->id())) {
      DP_LOG(WARNING) << "server '" << req->name() << "' (id " << node->id()
                      << ") restarted: ranges only it held are lost";
    }
    if (req->role() == proto::SERVER) Refill(&map_, options_.replicas);
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
    absl::MutexLock lock(&mu_);
    proto::NodeInfo* node = FindNode(req->node_id());
    if (node == nullptr) {
      return Err(absl::NotFoundError(absl::StrCat("unknown node ", req->node_id())));
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
    RecordApplied(node->id(), req->applied_epoch());
    reply->set_epoch(map_.epoch());
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
               absl::StrCat("left: ", req->reason().substr(0, 200)),
               req->finished());
    BumpEpoch();
    DP_LOG(INFO) << "worker '" << node->name() << "' (node " << node->id()
                 << ") left" << (req->finished() ? " after its last step" : "")
                 << ": " << req->reason().substr(0, 200) << "; epoch "
                 << map_.epoch();
    return grpc::Status::OK;
  }

  grpc::Status AckEpoch(grpc::ServerContext* ctx, const proto::AckEpochRequest* req,
                        proto::AckEpochReply*) override {
    absl::MutexLock lock(&mu_);
    if (FindNode(req->node_id()) == nullptr) {
      return Err(absl::NotFoundError(absl::StrCat("unknown node ", req->node_id())));
    }
    RecordApplied(req->node_id(), req->epoch());
    return grpc::Status::OK;
  }

  grpc::Status GetClusterMap(grpc::ServerContext* ctx, const proto::GetClusterMapRequest*,
                             proto::ClusterMap* map) override {
    absl::MutexLock lock(&mu_);
    *map = map_;
    return grpc::Status::OK;
  }

  grpc::Status WatchClusterMap(grpc::ServerContext* ctx,
                               const proto::WatchClusterMapRequest* req,
                               grpc::ServerWriter<proto::ClusterMap>* writer) override {
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
    return Err(DoCreateTable(*req, reply));
  }

  grpc::Status AdvanceClock(grpc::ServerContext* ctx,
                            const proto::AdvanceClockRequest* req,
                            proto::AdvanceClockReply* reply) override {
    absl::MutexLock lock(&mu_);
    if (!roster_.failure().ok()) return Err(roster_.failure());
    absl::Status s = clocks_.Advance(req->rank(), req->clock());
    if (!s.ok()) return Err(s);
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

  grpc::Status WaitClock(grpc::ServerContext* ctx, const proto::WaitClockRequest* req,
                         proto::WaitClockReply* reply) override {
    const absl::Duration timeout = req->timeout_ms() > 0
                                       ? absl::Milliseconds(req->timeout_ms())
                                       : absl::Seconds(60);
    absl::MutexLock lock(&mu_);
    if (req->rank() < 0 || req->rank() >= clocks_.size()) {
      return Err(absl::InvalidArgumentError(
          absl::StrCat("wait clock: rank ", req->rank(), " outside the job")));
    }
    auto may = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return stopping_ || !roster_.failure().ok() ||
             clocks_.MayProceed(req->clock());
    };
    if (!mu_.AwaitWithTimeout(absl::Condition(&may), timeout)) {
      return Err(absl::DeadlineExceededError(absl::StrCat(
          "worker ", req->rank(), " at clock ", req->clock(),
          " still blocked by gating clock ", clocks_.GatingClock(), " (",
          clocks_.policy().ToString(), ")")));
    }
    if (stopping_) return Err(absl::UnavailableError("scheduler shutting down"));
    if (!roster_.failure().ok()) return Err(roster_.failure());
    reply->set_gating_clock(clocks_.GatingClock());
    return grpc::Status::OK;
  }

  grpc::Status GetJobStatus(grpc::ServerContext* ctx, const proto::JobStatusRequest*,
                            proto::JobStatus* status) override {
    absl::MutexLock lock(&mu_);
    *status->mutable_job() = job_;
    status->set_gating_clock(clocks_.GatingClock());
    for (const auto& w : workers_) *status->add_workers() = w;
    if (!roster_.failure().ok()) {
      status->set_failure(std::string(roster_.failure().message()));
    }
    return grpc::Status::OK;
  }

  grpc::Status ReplicaReady(grpc::ServerContext* ctx,
                            const proto::ReplicaReadyRequest* req,
                            proto::ReplicaReadyReply*) override {
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
    absl::MutexLock lock(&mu_);
    Suspect(req->suspect(), absl::StrCat("node ", req->reporter(), ": ",
                                         req->reason().substr(0, 200)));
    return grpc::Status::OK;
  }

  grpc::Status Barrier(grpc::ServerContext* ctx, const proto::BarrierRequest* req,
                       proto::BarrierReply* reply) override {
    if (req->count() == 0) return Err(absl::InvalidArgumentError("barrier count 0"));
    const absl::Duration timeout = req->timeout_ms() > 0
                                       ? absl::Milliseconds(req->timeout_ms())
                                       : absl::Seconds(60);
    absl::MutexLock lock(&mu_);
    BarrierState& b = barriers_[req->name()];
    const uint64_t generation = b.generation;
    b.arrived.insert(req->node_id());
    if (b.arrived.size() >= req->count()) {
      b.arrived.clear();
      b.generation++;
      reply->set_arrived(req->count());
      return grpc::Status::OK;
    }
    auto released = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return stopping_ || !roster_.failure().ok() ||
             barriers_[req->name()].generation != generation;
    };
    if (!mu_.AwaitWithTimeout(absl::Condition(&released), timeout)) {
      barriers_[req->name()].arrived.erase(req->node_id());
      return Err(absl::DeadlineExceededError(absl::StrCat(
          "barrier '", req->name(), "': ", barriers_[req->name()].arrived.size() + 1,
          " of ", req->count(), " arrived in time")));
    }
    if (stopping_) return Err(absl::UnavailableError("scheduler shutting down"));
    if (barriers_[req->name()].generation == generation) {
      barriers_[req->name()].arrived.erase(req->node_id());
      return Err(roster_.failure());
    }
    reply->set_arrived(req->count());
    return grpc::Status::OK;
  }

 private:
  struct BarrierState {
    uint64_t generation = 0;
    absl::flat_hash_set<NodeId> arrived;
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
      return absl::InvalidArgumentError(
          absl::StrCat("table '", spec->name(), "': follows the job's policy (",
                       options_.policy.ToString(),
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
    const absl::Duration timeout = req.timeout_ms() > 0
                                       ? absl::Milliseconds(req.timeout_ms())
                                       : absl::Seconds(10);
    const absl::Time deadline = absl::Now() + timeout;
    proto::TableSpec spec = req.spec();
    spec.set_id(0);
    // A malformed spec fails at once, without waiting for servers.
    DP_RETURN_IF_ERROR(ApplyJobPolicy(&spec));
    DP_RETURN_IF_ERROR(ValidateTableShape(spec));
    absl::MutexLock lock(&mu_);
    auto existing_reply = [&](const proto::TableMap* t)
                              ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      *reply->mutable_spec() = t->spec();
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
    DP_RETURN_IF_ERROR(ValidateTableSpec(spec, plugins));

    spec.set_id(next_table_id_++);
    proto::TableMap* table = map_.add_tables();
    *table->mutable_spec() = spec;
    std::vector<NodeId> ring;
    for (const auto* s : servers) ring.push_back(s->id());
    std::sort(ring.begin(), ring.end());
    PlaceTable(table, ring, options_.replicas);
    BumpEpoch();
    const Epoch epoch = map_.epoch();
    DP_LOG(INFO) << "table '" << spec.name() << "' (id " << spec.id() << ") over "
                 << table->ranges_size() << " ranges, " << options_.replicas
                 << " holders each, epoch " << epoch;
    std::vector<NodeId> waiting;
    for (const auto* s : servers) waiting.push_back(s->id());
    // Servers that died meanwhile are not waited for.
    auto late = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      std::vector<NodeId> out;
      for (NodeId id : waiting) {
        const proto::NodeInfo* n = FindNode(id);
        if (n != nullptr && n->state() == proto::ALIVE && applied_[id] < epoch) {
          out.push_back(id);
        }
      }
      return out;
    };
    auto all_applied = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return stopping_ || late().empty();
    };
    mu_.AwaitWithDeadline(absl::Condition(&all_applied), deadline);
    if (stopping_) return absl::UnavailableError("scheduler shutting down");
    const std::vector<NodeId> missing = late();
    if (!missing.empty()) {
      return absl::DeadlineExceededError(absl::StrCat(
          "table '", spec.name(), "' declared, but servers ",
          absl::StrJoin(missing, ", "), " did not apply epoch ", epoch,
          " within ", absl::FormatDuration(timeout)));
    }
    *reply->mutable_spec() = spec;
    reply->set_epoch(epoch);
    reply->set_created(true);
    return absl::OkStatus();
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
        // Clients do not heartbeat.
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
      if (dead.empty()) continue;
      for (NodeId id : dead) {
        suspect_since_.erase(id);
        RemoveServer(&map_, id);
        const proto::NodeInfo* n = FindNodeConst(id);
        if (n->role() == proto::WORKER) {
          WorkerGone(id, n->name(), "missed heartbeats", /*finished=*/false);
        }
      }
      Refill(&map_, options_.replicas);
      BumpEpoch();
      DP_LOG(INFO) << "cluster map epoch " << map_.epoch();
    }
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
                        << ", clock " << clocks_.clock(rank) << ") lost: "
                        << how << "; waiting up to "
                        << absl::FormatDuration(options_.worker_loss.replace_timeout)
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
    for (int rank : roster_.Check(now)) {
      clocks_.Retire(rank);
      workers_[rank].set_lost(false);
      workers_[rank].set_retired(true);
    }
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
  WorkerRoster roster_ ABSL_GUARDED_BY(mu_);
  std::vector<proto::WorkerStatus> workers_ ABSL_GUARDED_BY(mu_);
  // Workers' ranks, both ways; a rank is held by at most one node.
  absl::flat_hash_map<NodeId, int> rank_of_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<int, NodeId> rank_holder_ ABSL_GUARDED_BY(mu_);
  TableId next_table_id_ ABSL_GUARDED_BY(mu_) = 1;
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
