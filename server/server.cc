#include "server/server.h"

#include <unistd.h>

#include <atomic>
#include <functional>
#include <random>
#include <thread>

#include "absl/algorithm/container.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "cluster/scheduler_client.h"
#include "common/buffer_pool.h"
#include "common/error_reason.h"
#include "common/grpc_server.h"
#include "common/grpc_status.h"
#include "common/logging.h"
#include "common/serial_executor.h"
#include "common/status_macros.h"
#include "grpcpp/grpcpp.h"
#include "handlers/plugin_registry.h"
#include "metrics/request_stats.h"
#include "proto/downpour.grpc.pb.h"
#include "server/internal/checkpointer.h"
#include "server/internal/dispatcher.h"
#include "server/stats_metrics.h"
#include "storage/cold_store.h"
#include "storage/database.h"
#include "transport/data_client.h"
#include "transport/data_server.h"

namespace downpour {
namespace {

using server_internal::Checkpointer;
using server_internal::Dispatcher;

class AdminService final : public proto::ServerAdmin::Service {
 public:
  // `stats` fills the stats, or returns false before registration.
  explicit AdminService(std::function<bool(proto::ServerStats*)> stats)
      : stats_(std::move(stats)) {}

  // The checkpointer exists only once the server has registered.
  void set_checkpointer(Checkpointer* c) { checkpointer_.store(c); }

  grpc::Status GetStats(grpc::ServerContext*, const proto::StatsRequest*,
                        proto::ServerStats* stats) override {
    if (!stats_(stats)) {
      return grpc::Status(grpc::StatusCode::UNAVAILABLE, "not registered yet");
    }
    return grpc::Status::OK;
  }

  grpc::Status CheckpointPart(grpc::ServerContext*,
                              const proto::CheckpointPartRequest* req,
                              proto::CheckpointPartReply* reply) override {
    Checkpointer* c = checkpointer_.load();
    if (c == nullptr) return NotRegistered();
    auto r = c->CheckpointPart(*req);
    if (!r.ok()) return ToGrpcStatus(r.status());
    *reply = *std::move(r);
    return grpc::Status::OK;
  }
  grpc::Status DropCheckpoints(grpc::ServerContext*,
                               const proto::DropCheckpointsRequest* req,
                               proto::DropCheckpointsReply*) override {
    Checkpointer* c = checkpointer_.load();
    if (c == nullptr) return NotRegistered();
    return ToGrpcStatus(c->DropCheckpoints(*req));
  }
  grpc::Status Restore(grpc::ServerContext*, const proto::RestoreRequest* req,
                       proto::RestoreReply* reply) override {
    Checkpointer* c = checkpointer_.load();
    if (c == nullptr) return NotRegistered();
    auto r = c->Restore(*req);
    if (!r.ok()) return ToGrpcStatus(r.status());
    *reply = *std::move(r);
    return grpc::Status::OK;
  }
  grpc::Status ExportRows(grpc::ServerContext*,
                          const proto::ExportRowsRequest* req,
                          proto::ExportRowsReply* reply) override {
    Checkpointer* c = checkpointer_.load();
    if (c == nullptr) return NotRegistered();
    auto r = c->ExportRows(*req);
    if (!r.ok()) return ToGrpcStatus(r.status());
    *reply = *std::move(r);
    return grpc::Status::OK;
  }

 private:
  static grpc::Status NotRegistered() {
    return grpc::Status(grpc::StatusCode::UNAVAILABLE, "not registered yet");
  }

  const std::function<bool(proto::ServerStats*)> stats_;
  std::atomic<Checkpointer*> checkpointer_{nullptr};
};

// What the replication engine needs from the running server: the data
// server's receive thread (everything replication does runs there), a
// client for talking to peer servers, and a thread for scheduler calls.
class ServerEnv final : public server_internal::ReplicationEnv {
 public:
  ServerEnv(DataServer* data, DataClient* peers, SchedulerClient* scheduler,
            NodeId self, absl::Duration handover_delay)
      : data_(data),
        peers_(peers),
        scheduler_(scheduler),
        self_(self),
        handover_delay_(handover_delay) {}

  void SendToPeer(const std::string& endpoint, OutgoingRequest request,
                  PeerDone done) override {
    // The reply arrives on the peer client's I/O thread; the replicator
    // wants it on the data thread.
    peers_->Send(endpoint, std::move(request), absl::Now() + absl::Seconds(10),
                 [data = data_, done = std::move(done)](
                     const absl::Status& s, const IncomingMessage* reply) {
                   auto header = std::make_shared<proto::DataHeader>();
                   if (reply != nullptr) *header = reply->header;
                   data->Post([done, s, header, ok = reply != nullptr] {
                     done(s, ok ? header.get() : nullptr);
                   });
                 });
  }
  void SendDeferred(DeferredReply reply) override {
    data_->SendDeferred(std::move(reply));
  }
  std::shared_ptr<const RetainedRequest> Retain(
      const IncomingMessage& request) override {
    return data_->Retain(request);
  }
  void PostAfter(absl::Duration delay, std::function<void()> fn) override {
    data_->PostAfter(delay, std::move(fn));
  }
  void ReplicaReady(TableId table, Key range_begin, NodeId backup,
                    Epoch epoch) override {
    proto::ReplicaReadyRequest req;
    req.set_primary(self_);
    req.set_table_id(table);
    req.set_range_begin(range_begin);
    req.set_backup(backup);
    req.set_epoch(epoch);
    control_.Schedule([this, req] {
      // Retried until the scheduler answers, through a scheduler outage
      // too: a replica it never hears of is never promotable. It refuses
      // (for good) a report that no longer matches its map.
      absl::Duration backoff = absl::Milliseconds(100);
      while (!stopping_.load()) {
        absl::Status s = scheduler_->ReplicaReady(req);
        if (s.ok() || (s.code() != absl::StatusCode::kUnavailable &&
                       s.code() != absl::StatusCode::kDeadlineExceeded)) {
          if (!s.ok()) DP_LOG(WARNING) << s;
          return;
        }
        absl::SleepFor(backoff);
        backoff = std::min(backoff * 2, absl::Seconds(1));
      }
    });
  }
  void HandedOver(TableId table, Key range_begin, NodeId to,
                  Epoch epoch) override {
    proto::ReplicaReadyRequest req;
    req.set_primary(self_);
    req.set_table_id(table);
    req.set_range_begin(range_begin);
    req.set_backup(to);
    req.set_epoch(epoch);
    req.set_hand_over(true);
    auto report = [this, req] {
      control_.Schedule([this, req] {
        // Not retried: a scheduler that missed it (or moved its map on)
        // cancels the handover after its timeout, or the next map's
        // HandOver reports again.
        absl::Status s = scheduler_->ReplicaReady(req);
        if (!s.ok()) DP_LOG(INFO) << "handover report: " << s;
      });
    };
    // Fault injection: a slow report keeps the range's writes refused.
    if (handover_delay_ > absl::ZeroDuration()) {
      data_->PostAfter(handover_delay_, report);
    } else {
      report();
    }
  }
  // Ends the retries of scheduler calls (the server is stopping).
  void Stop() { stopping_.store(true); }

  void ReportUnreachable(NodeId peer, const std::string& why) override {
    control_.Schedule([this, peer, why] {
      absl::Status s = scheduler_->ReportUnreachable(self_, peer, why);
      if (!s.ok()) DP_LOG(WARNING) << s;
    });
  }

 private:
  DataServer* const data_;
  DataClient* const peers_;
  SchedulerClient* const scheduler_;
  const NodeId self_;
  const absl::Duration handover_delay_;
  std::atomic<bool> stopping_{false};
  SerialExecutor control_;
};

uint64_t RandomIncarnation() {
  std::random_device rd;
  return (static_cast<uint64_t>(rd()) << 32 | rd()) | 1;
}

// Replaces the host of "tcp://host:port".
std::string Advertise(const std::string& endpoint, const std::string& host) {
  if (host.empty()) return endpoint;
  const size_t colon = endpoint.rfind(':');
  return absl::StrCat("tcp://", host, endpoint.substr(colon));
}

class ServerImpl final : public Server {
 public:
  explicit ServerImpl(const ServerOptions& options)
      : options_(options),
        scheduler_(options.scheduler_address, absl::Seconds(10), options.auth),
        incarnation_(RandomIncarnation()) {}
  ~ServerImpl() override { Shutdown(); }

  absl::Status Init();

  NodeId id() const override { return id_; }
  const std::string& data_endpoint() const override { return endpoint_; }
  std::string admin_address() const override {
    return absl::StrCat(
        options_.advertise_host.empty() ? "127.0.0.1" : options_.advertise_host,
        ":", admin_port_);
  }

  absl::Status Wait() override {
    done_.WaitForNotification();
    absl::MutexLock lock(&mu_);
    return exit_status_;
  }

  void Shutdown() override {
    {
      absl::MutexLock lock(&mu_);
      if (shut_down_) {
        // Another thread is shutting down (the signal handler, main() once
        // a drained server's Wait returned): return once it has finished,
        // so that nobody destroys the server under it.
        mu_.Await(absl::Condition(&shutdown_finished_));
        return;
      }
      shut_down_ = true;
    }
    DP_LOG(INFO) << "shutting down";
    metrics_registration_.Reset();
    // Not ready first, so that probes see it leave before its sockets close.
    if (admin_health_ != nullptr) admin_health_->SetReady(false);
    scheduler_.CancelWatch();
    stop_.Notify();
    if (env_ != nullptr) env_->Stop();
    if (watch_thread_.joinable()) watch_thread_.join();
    if (heartbeat_thread_.joinable()) heartbeat_thread_.join();
    // Checkpoint calls waiting on the data thread end before it stops.
    if (checkpointer_ != nullptr) checkpointer_->Stop();
    if (admin_ != nullptr) admin_->Shutdown(gpr_now(GPR_CLOCK_MONOTONIC));
    if (data_ != nullptr) data_->Stop();
    peers_.reset();  // fails forwards in flight; their closures are dropped
    if (!done_.HasBeenNotified()) done_.Notify();
    absl::MutexLock lock(&mu_);
    shutdown_finished_ = true;
  }

  bool DrainAndLeave(absl::Duration timeout) override;

  bool AwaitLastCheckpoint(absl::Duration start_wait, absl::Duration grace,
                           absl::Time since) override {
    if (checkpointer_ == nullptr || db_ == nullptr) return false;
    // Not ready: Kubernetes stops sending it new clients, while the job's
    // own keep working until the checkpoint is written.
    if (admin_health_ != nullptr) admin_health_->SetReady(false);
    DP_LOG(INFO) << "stopping: waiting up to " << absl::FormatDuration(grace)
                 << " for the scheduler's last checkpoint";
    const bool done =
        checkpointer_->AwaitCheckpointAfter(since, start_wait, grace);
    DP_LOG(INFO) << (done ? "last checkpoint complete"
                          : "no last checkpoint came");
    return done;
  }

 private:
  void Fail(absl::Status status) {
    DP_LOG(ERROR) << status;
    absl::MutexLock lock(&mu_);
    if (exit_status_.ok()) exit_status_ = status;
    if (!done_.HasBeenNotified()) done_.Notify();
  }
  proto::RegisterRequest RegisterRequest() const {
    proto::RegisterRequest reg;
    reg.set_role(proto::SERVER);
    reg.set_name(options_.name);
    reg.set_data_endpoint(endpoint_);
    reg.set_admin_address(admin_address());
    reg.set_incarnation(incarnation_);
    reg.set_max_message_bytes(options_.max_message_bytes);
    reg.set_previous_id(id_);
    reg.set_memory_limit_bytes(options_.max_table_bytes);
    for (const std::string& n : plugins_.names()) reg.add_plugin_handlers(n);
    return reg;
  }
  void ApplyAndAck(const proto::ClusterMap& map);
  // A draining server that `map` leaves without a range leaves the
  // cluster: Wait() then returns OK.
  void LeaveIfDrained(const proto::ClusterMap& map);
  void WatchLoop();
  void HeartbeatLoop();
  // Every second, on the data thread: bounded sparse tables' idle rows
  // expire (TTL) even when no write comes to make room.
  void ScheduleExpiry() {
    data_->PostAfter(absl::Seconds(1), [this] {
      if (stop_.HasBeenNotified()) return;
      dispatcher_->ExpireIdle();
      ScheduleExpiry();
    });
  }
  // GetStats' answer; false before registration.
  bool FillStats(proto::ServerStats* stats) ABSL_LOCKS_EXCLUDED(stats_mu_);

  const ServerOptions options_;
  SchedulerClient scheduler_;
  PluginRegistry plugins_;
  BufferPool pool_;
  NodeId id_ = kNoNode;
  std::string endpoint_;
  int admin_port_ = 0;
  absl::Duration heartbeat_interval_ = absl::Milliseconds(500);
  // A random number fixed for this process (RegisterRequest.incarnation).
  const uint64_t incarnation_;
  std::unique_ptr<DataServer> data_;
  std::unique_ptr<DataClient> peers_;  // to the backups of our ranges
  std::unique_ptr<ServerEnv> env_;
  // The cold tiers of bounded sparse tables (with options_.data_dir);
  // outlives the dispatcher, whose ranges use it.
  std::unique_ptr<storage::ColdStore> cold_;
  std::unique_ptr<Dispatcher> dispatcher_;
  std::unique_ptr<storage::Database> db_;  // with options_.data_dir
  std::unique_ptr<Checkpointer> checkpointer_;
  // Set once the dispatcher serves (stats are read from other threads).
  std::atomic<const Dispatcher*> serving_{nullptr};
  // The figures only the data thread reads, as it last reported them.
  absl::Mutex stats_mu_;
  proto::ServerStats data_thread_stats_ ABSL_GUARDED_BY(stats_mu_);
  // Only with options_.metrics.
  std::unique_ptr<RequestStats> request_stats_;
  MetricsRegistry::Registration metrics_registration_;
  // The newest epoch applied whose table failures (if any) the scheduler
  // has heard of: what heartbeats report.
  std::atomic<Epoch> reportable_epoch_{0};
  std::unique_ptr<AdminService> admin_service_;
  std::unique_ptr<HealthService> admin_health_;  // outlives admin_
  std::unique_ptr<grpc::Server> admin_;
  std::thread watch_thread_;
  std::thread heartbeat_thread_;
  absl::Notification stop_;
  absl::Notification done_;
  // Drained and left the cluster (LeaveIfDrained).
  absl::Notification left_;
  bool id_mismatch_logged_ = false;  // heartbeat thread only
  absl::Mutex mu_;
  bool shut_down_ ABSL_GUARDED_BY(mu_) = false;
  bool shutdown_finished_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status exit_status_ ABSL_GUARDED_BY(mu_);
};

absl::Status ServerImpl::Init() {
  if (options_.scheduler_address.empty()) {
    return absl::InvalidArgumentError("no scheduler address");
  }
  for (const std::string& path : options_.plugin_paths) {
    DP_RETURN_IF_ERROR(plugins_.Load(path), "load handler plugin ", path);
    DP_LOG(INFO) << "loaded handler plugin " << path;
  }
  if (!options_.data_dir.empty()) {
    if (options_.name.empty()) {
      return absl::InvalidArgumentError(
          "a server with a data dir needs a name: checkpoints are restored "
          "onto the server of the same name");
    }
    storage::DatabaseOptions db;
    db.bulk = true;
    db.fail_after_bytes = options_.inject_disk_full_after_bytes;
    DP_ASSIGN_OR_RETURN(db_, storage::Database::Open(options_.data_dir, db),
                        "data dir");
    DP_LOG(INFO) << "checkpoints in " << options_.data_dir;
    // Rows an earlier process evicted are gone with its memory: the tier
    // starts empty (storage/cold_store.h).
    DP_ASSIGN_OR_RETURN(cold_,
                        storage::ColdStore::Open(options_.data_dir + "/cold"),
                        "cold tier");
  }

  DataServerOptions data_options;
  data_options.bind_endpoint = options_.data_bind;
  data_options.max_message_bytes = options_.max_message_bytes;
  data_options.auth = options_.auth;
  DP_ASSIGN_OR_RETURN(data_, DataServer::Create(data_options, &pool_));
  endpoint_ = Advertise(data_->endpoint(), options_.advertise_host);

  // The admin service starts before registration so that the map can
  // advertise its port; stats become available once the dispatcher exists.
  // It reports NOT_SERVING (not ready) until the first map is applied.
  admin_service_ = std::make_unique<AdminService>(
      [this](proto::ServerStats* stats) { return FillStats(stats); });
  if (options_.metrics != nullptr) {
    request_stats_ = std::make_unique<RequestStats>();
    metrics_registration_ = options_.metrics->Add([this](MetricWriter* w) {
      proto::ServerStats stats;
      const bool ready = FillStats(&stats);
      WriteServerMetrics(ready, stats, request_stats_->Snapshot(), w);
    });
  }
  DP_ASSIGN_OR_RETURN(
      StartedGrpcServer started,
      StartGrpcServer(options_.admin_listen, admin_service_.get(),
                      "admin service", options_.auth, /*ready=*/false));
  admin_health_ = std::move(started.health);
  admin_ = std::move(started.server);
  admin_port_ = started.port;

  DP_ASSIGN_OR_RETURN(
      proto::RegisterReply reply,
      scheduler_.Register(RegisterRequest(), options_.connect_timeout));
  id_ = reply.node_id();
  SetLogTag(absl::StrCat("server ", id_));
  if (reply.heartbeat_interval_ms() > 0) {
    heartbeat_interval_ = absl::Milliseconds(reply.heartbeat_interval_ms());
  }
  server_internal::PinOptions pins;
  pins.min_bytes = options_.zero_copy_min_bytes;
  DataClientOptions peer_options;
  peer_options.max_message_bytes = options_.max_message_bytes;
  peer_options.auth = options_.auth;
  DP_ASSIGN_OR_RETURN(peers_, DataClient::Create(peer_options, &pool_));
  env_ = std::make_unique<ServerEnv>(data_.get(), peers_.get(), &scheduler_,
                                     id_, options_.inject_handover_delay);
  dispatcher_ = std::make_unique<Dispatcher>(
      id_, options_.max_message_bytes, &pool_, &plugins_, pins, env_.get(),
      options_.max_table_bytes, cold_.get());
  dispatcher_->InjectCopyDelay(options_.inject_copy_delay);
  // An empty path: that gate stays open.
  auto file_gate = [](const std::string& path) -> std::function<bool()> {
    if (path.empty()) return nullptr;
    return [path] { return access(path.c_str(), F_OK) == 0; };
  };
  dispatcher_->InjectGates({file_gate(options_.inject_copy_gate),
                            file_gate(options_.inject_handover_gate)},
                           options_.inject_gate_node);
  server_internal::DataThread thread;
  thread.post = [data = data_.get()](std::function<void()> fn) {
    data->Post(std::move(fn));
  };
  thread.send_deferred = [data = data_.get()](DeferredReply r) {
    data->SendDeferred(std::move(r));
  };
  checkpointer_ = std::make_unique<Checkpointer>(options_.name, db_.get(),
                                                 dispatcher_.get(), thread,
                                                 size_t{4} << 20, cold_.get());
  admin_service_->set_checkpointer(checkpointer_.get());
  serving_.store(dispatcher_.get());
  DP_LOG(INFO) << "registered with scheduler " << options_.scheduler_address
               << " as node " << id_ << "; data plane " << endpoint_
               << ", admin 127.0.0.1:" << admin_port_;

  data_->Start([d = dispatcher_.get(), c = checkpointer_.get(),
                data = data_.get(), stats = request_stats_.get()](
                   const IncomingMessage& req, OutgoingReply* rep) {
    // Two clock reads and a few relaxed atomic adds, only with metrics on.
    const int64_t start = stats != nullptr ? absl::GetCurrentTimeNanos() : 0;
    // Empty (no allocation) unless a BSP step answers PushPulls that were
    // waiting for it.
    std::vector<DeferredReply> released;
    d->Handle(req, rep, &released);
    // A checkpoint waiting for this step cuts its range now, before any
    // reply lets a worker start the next step.
    c->AfterRequest();
    for (DeferredReply& r : released) data->SendDeferred(std::move(r));
    if (stats != nullptr) {
      const proto::DataHeader& h = req.header;
      const bool replica = h.replication().kind() != proto::Replication::NONE;
      stats->Record(replica ? kReplicationOp : static_cast<uint32_t>(h.op()),
                    replica ? 0 : h.table_id(), rep->header.status_code() != 0,
                    absl::GetCurrentTimeNanos() - start);
    }
  });
  ApplyAndAck(reply.map());
  ScheduleExpiry();
  watch_thread_ = std::thread([this] { WatchLoop(); });
  heartbeat_thread_ = std::thread([this] { HeartbeatLoop(); });
  // Registered and serving its ranges: a Kubernetes readiness probe passes.
  admin_health_->SetReady(true);
  return absl::OkStatus();
}

bool ServerImpl::FillStats(proto::ServerStats* stats) {
  const Dispatcher* d = serving_.load();
  if (d == nullptr) return false;
  d->FillStats(stats);
  const DataServerCounters& c = data_->counters();
  stats->set_bytes_in(c.bytes_in.load());
  stats->set_bytes_out(c.bytes_out.load());
  stats->set_errors(stats->errors() + c.framing_errors.load());
  stats->set_auth_failures(c.auth_failures.load());
  stats->set_data_thread_queue(data_->PostedDue());
  // The replication figures and the deferred replies belong to the data
  // thread: ask it, and wait a little. A data thread too busy to answer in
  // time (or stopped) leaves the last figures it gave.
  struct Asked {
    absl::Notification done;
    proto::ServerStats stats;
  };
  auto asked = std::make_shared<Asked>();
  data_->Post([asked, d, data = data_.get()] {
    d->FillReplicationStats(&asked->stats);
    d->FillRangeLoads(asked->stats.mutable_ranges());
    asked->stats.set_deferred_replies(data->deferred());
    asked->done.Notify();
  });
  const bool answered =
      asked->done.WaitForNotificationWithTimeout(absl::Milliseconds(500));
  absl::MutexLock lock(&stats_mu_);
  if (answered) data_thread_stats_ = asked->stats;
  const proto::ServerStats& t = data_thread_stats_;
  stats->set_replication_forwarded(t.replication_forwarded());
  stats->set_replication_resent(t.replication_resent());
  stats->set_replication_copies(t.replication_copies());
  stats->set_replication_rows_copied(t.replication_rows_copied());
  stats->set_held_writes(t.held_writes());
  stats->set_deferred_replies(t.deferred_replies());
  *stats->mutable_ranges() = t.ranges();
  return true;
}

void ServerImpl::ApplyAndAck(const proto::ClusterMap& map) {
  // New ranges are allocated here, off the data thread; the data thread
  // then switches to the map between two requests, so that what it owns
  // (ranges, roles, replication streams) needs no lock.
  auto prepared = dispatcher_->PrepareMap(map);
  std::vector<proto::TableFailure> failures;
  for (const auto& [table, why] : prepared->failures) {
    proto::TableFailure f;
    f.set_table_id(table);
    f.set_code(static_cast<int>(why.code()));
    f.set_message(std::string(why.message()));
    failures.push_back(std::move(f));
  }
  auto installed = std::make_shared<absl::Notification>();
  auto status = std::make_shared<absl::Status>();
  data_->Post([this, installed, status,
               p = std::make_shared<decltype(prepared)>(std::move(prepared))] {
    *status = dispatcher_->InstallMap(std::move(*p));
    installed->Notify();
  });
  while (!installed->WaitForNotificationWithTimeout(absl::Milliseconds(200))) {
    if (stop_.HasBeenNotified()) return;
  }
  if (!status->ok())
    DP_LOG(ERROR) << "epoch " << map.epoch() << ": " << *status;
  // Heartbeats report an epoch as applied too, which the scheduler takes as
  // "every table created": with failures, only once the scheduler has
  // heard of them.
  if (failures.empty()) reportable_epoch_.store(map.epoch());
  absl::Status acked = scheduler_.AckEpoch(id_, map.epoch(), failures);
  if (!acked.ok()) {
    DP_LOG(WARNING) << acked;
  } else {
    reportable_epoch_.store(map.epoch());
  }
  LeaveIfDrained(map);
}

void ServerImpl::LeaveIfDrained(const proto::ClusterMap& map) {
  if (left_.HasBeenNotified()) return;
  const proto::NodeInfo* self = nullptr;
  for (const proto::NodeInfo& n : map.nodes()) {
    if (n.id() == id_) self = &n;
  }
  if (self == nullptr) return;
  if (self->state() != proto::LEFT) {
    if (self->state() != proto::ALIVE || !self->draining()) return;
    for (const proto::TableMap& t : map.tables()) {
      for (const proto::RangeAssignment& r : t.ranges()) {
        if (r.primary() == id_ || absl::c_linear_search(r.replicas(), id_) ||
            absl::c_linear_search(r.catching_up(), id_)) {
          return;
        }
      }
    }
    absl::Status s = scheduler_.Leave(id_, /*finished=*/true,
                                      "drained: every range moved away");
    if (!s.ok()) {
      DP_LOG(WARNING) << "drained, but could not leave: " << s
                      << "; trying again with the next map";
      return;
    }
  }
  DP_LOG(INFO) << "drained: every range this server held moved to other "
               << "servers; it left the cluster (epoch " << map.epoch() << ")";
  left_.Notify();
  if (!done_.HasBeenNotified()) done_.Notify();  // Wait() returns OK
}

bool ServerImpl::DrainAndLeave(absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  proto::DrainRequest req;
  req.set_node_id(id_);
  bool asked = false, waiting_logged = false;
  // Asked again every half second (idempotent): the answer says how far
  // the drain is, or that it was called off (the scheduler is stopping).
  while (!left_.HasBeenNotified() && absl::Now() < deadline) {
    absl::StatusOr<proto::DrainReply> r = scheduler_.Drain(req);
    if (r.ok()) {
      if (!asked) {
        DP_LOG(INFO) << "draining: " << r->ranges_held()
                     << " range(s) to move to other servers";
      }
      asked = true;
      if (!r->draining() && !r->left()) {
        DP_LOG(WARNING) << "the drain was called off";
        return false;
      }
    } else if (ReasonOf(r.status()) == ErrorReason::kDrainUnderWay) {
      if (!waiting_logged) {
        waiting_logged = true;
        DP_LOG(INFO) << r.status() << "; waiting for it";
      }
    } else {
      DP_LOG(WARNING) << "cannot drain: " << r.status();
      return false;
    }
    left_.WaitForNotificationWithTimeout(
        std::min(absl::Milliseconds(500), deadline - absl::Now()));
  }
  if (left_.HasBeenNotified()) return true;
  if (asked) {
    DP_LOG(WARNING) << "not drained within " << absl::FormatDuration(timeout)
                    << "; the drain is called off";
    req.set_cancel(true);
    (void)scheduler_.Drain(req);
  }
  return false;
}

void ServerImpl::WatchLoop() {
  while (!stop_.HasBeenNotified()) {
    absl::Status s = scheduler_.Watch(
        id_, dispatcher_->epoch(),
        [this](const proto::ClusterMap& map) { ApplyAndAck(map); });
    if (stop_.HasBeenNotified()) break;
    DP_LOG(WARNING) << s << "; watching again";
    stop_.WaitForNotificationWithTimeout(absl::Milliseconds(500));
  }
}

void ServerImpl::HeartbeatLoop() {
  absl::Time ranges_reported = absl::InfinitePast();
  while (!stop_.WaitForNotificationWithTimeout(heartbeat_interval_)) {
    if (left_.HasBeenNotified()) return;  // drained: not a member any more
    proto::HeartbeatRequest req;
    req.set_node_id(id_);
    req.set_applied_epoch(reportable_epoch_.load());
    // About once a second, the primary ranges' sizes (the scheduler weighs
    // sparse ranges by them when it moves ranges).
    if (absl::Now() - ranges_reported >= absl::Seconds(1)) {
      ranges_reported = absl::Now();
      auto loads = std::make_shared<
          std::pair<absl::Notification,
                    google::protobuf::RepeatedPtrField<proto::RangeLoad>>>();
      data_->Post([loads, d = dispatcher_.get()] {
        d->FillRangeLoads(&loads->second);
        loads->first.Notify();
      });
      if (loads->first.WaitForNotificationWithTimeout(
              absl::Milliseconds(200))) {
        *req.mutable_ranges() = loads->second;
      }
    }
    auto reply = scheduler_.Heartbeat(req);
    if (reply.ok()) continue;
    if (left_.HasBeenNotified()) return;
    const absl::StatusCode code = reply.status().code();
    if (code != absl::StatusCode::kFailedPrecondition &&
        code != absl::StatusCode::kNotFound) {
      DP_LOG(WARNING) << reply.status();
      continue;
    }
    // Declared dead (e.g. after a long pause) or unknown to a restarted
    // scheduler: register again under the same name (and id).
    DP_LOG(WARNING) << reply.status() << "; registering again";
    auto again = scheduler_.Register(RegisterRequest(), absl::Seconds(5));
    if (!again.ok()) {
      DP_LOG(WARNING) << again.status();
    } else if (again->node_id() != id_ && !id_mismatch_logged_) {
      // Only a scheduler that lost its state (no --state_dir) does this.
      // The server keeps serving what it holds; nothing exits.
      id_mismatch_logged_ = true;
      DP_LOG(ERROR) << "the scheduler registered this server as node "
                    << again->node_id() << " instead of " << id_
                    << ": it lost its state (run it with --state_dir); "
                    << "ranges it assigns to node " << again->node_id()
                    << " are not served here";
    }
  }
}

}  // namespace

absl::StatusOr<std::unique_ptr<Server>> Server::Create(
    const ServerOptions& options) {
  auto server = std::make_unique<ServerImpl>(options);
  DP_RETURN_IF_ERROR(server->Init());
  return std::unique_ptr<Server>(std::move(server));
}

}  // namespace downpour
