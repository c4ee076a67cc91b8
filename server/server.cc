#include "server/server.h"

#include <atomic>
#include <random>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "cluster/scheduler_client.h"
#include "common/buffer_pool.h"
#include "common/grpc_server.h"
#include "common/grpc_status.h"
#include "common/logging.h"
#include "common/serial_executor.h"
#include "common/status_macros.h"
#include "grpcpp/grpcpp.h"
#include "handlers/plugin_registry.h"
#include "proto/downpour.grpc.pb.h"
#include "server/internal/dispatcher.h"
#include "transport/data_client.h"
#include "transport/data_server.h"

namespace downpour {
namespace {

using server_internal::Dispatcher;

class AdminService final : public proto::ServerAdmin::Service {
 public:
  AdminService(const DataServer* data, ClusterAuth auth)
      : data_(data), auth_(std::move(auth)) {}

  // The dispatcher exists only once the server has registered.
  void set_dispatcher(const Dispatcher* d) { dispatcher_.store(d); }

  grpc::Status GetStats(grpc::ServerContext* ctx, const proto::StatsRequest*,
                        proto::ServerStats* stats) override {
    if (grpc::Status a = auth_.Check(ctx); !a.ok()) return a;
    const Dispatcher* dispatcher = dispatcher_.load();
    if (dispatcher == nullptr) {
      return grpc::Status(grpc::StatusCode::UNAVAILABLE, "not registered yet");
    }
    dispatcher->FillStats(stats);
    stats->set_bytes_in(data_->counters().bytes_in.load());
    stats->set_bytes_out(data_->counters().bytes_out.load());
    stats->set_errors(stats->errors() +
                      data_->counters().framing_errors.load());
    stats->set_auth_failures(data_->counters().auth_failures.load());
    return grpc::Status::OK;
  }

 private:
  std::atomic<const Dispatcher*> dispatcher_{nullptr};
  const DataServer* const data_;
  const ClusterAuth auth_;
};

// What the replication engine needs from the running server: the data
// server's receive thread (everything replication does runs there), a
// client for talking to peer servers, and a thread for scheduler calls.
class ServerEnv final : public server_internal::ReplicationEnv {
 public:
  ServerEnv(DataServer* data, DataClient* peers, SchedulerClient* scheduler,
            NodeId self)
      : data_(data), peers_(peers), scheduler_(scheduler), self_(self) {}

  void SendToPeer(const std::string& endpoint, OutgoingRequest request,
                  PeerDone done) override {
    // The reply arrives on the peer client's I/O thread; the replicator
    // wants it on the data thread.
    peers_->Send(endpoint, std::move(request),
                 absl::Now() + absl::Seconds(10),
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
      // Retried until the scheduler answers: a replica it never hears of
      // is never promotable. It refuses (for good) a report that no longer
      // matches its map.
      for (int attempt = 0; attempt < 50; ++attempt) {
        absl::Status s = scheduler_->ReplicaReady(req);
        if (s.ok() || s.code() != absl::StatusCode::kUnavailable) {
          if (!s.ok()) DP_LOG(WARNING) << s;
          return;
        }
        absl::SleepFor(absl::Milliseconds(100));
      }
    });
  }
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
        scheduler_(options.scheduler_address, absl::Seconds(10),
                   options.auth),
        incarnation_(RandomIncarnation()) {}
  ~ServerImpl() override { Shutdown(); }

  absl::Status Init();

  NodeId id() const override { return id_; }
  const std::string& data_endpoint() const override { return endpoint_; }
  std::string admin_address() const override {
    return absl::StrCat(options_.advertise_host.empty() ? "127.0.0.1"
                                                        : options_.advertise_host,
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
      if (shut_down_) return;
      shut_down_ = true;
    }
    DP_LOG(INFO) << "shutting down";
    // Not ready first, so that probes see it leave before its sockets close.
    if (admin_health_ != nullptr) admin_health_->SetReady(false);
    scheduler_.CancelWatch();
    stop_.Notify();
    if (watch_thread_.joinable()) watch_thread_.join();
    if (heartbeat_thread_.joinable()) heartbeat_thread_.join();
    if (admin_ != nullptr) admin_->Shutdown(gpr_now(GPR_CLOCK_MONOTONIC));
    if (data_ != nullptr) data_->Stop();
    peers_.reset();  // fails forwards in flight; their closures are dropped
    if (!done_.HasBeenNotified()) done_.Notify();
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
    reg.set_memory_limit_bytes(options_.max_table_bytes);
    for (const std::string& n : plugins_.names()) reg.add_plugin_handlers(n);
    return reg;
  }
  void ApplyAndAck(const proto::ClusterMap& map);
  void WatchLoop();
  void HeartbeatLoop();

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
  std::unique_ptr<Dispatcher> dispatcher_;
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
  absl::Mutex mu_;
  bool shut_down_ ABSL_GUARDED_BY(mu_) = false;
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

  DataServerOptions data_options;
  data_options.bind_endpoint = options_.data_bind;
  data_options.max_message_bytes = options_.max_message_bytes;
  data_options.auth = options_.auth;
  DP_ASSIGN_OR_RETURN(data_, DataServer::Create(data_options, &pool_));
  endpoint_ = Advertise(data_->endpoint(), options_.advertise_host);

  // The admin service starts before registration so that the map can
  // advertise its port; stats become available once the dispatcher exists.
  // It reports NOT_SERVING (not ready) until the first map is applied.
  admin_service_ = std::make_unique<AdminService>(data_.get(), options_.auth);
  DP_ASSIGN_OR_RETURN(
      StartedGrpcServer started,
      StartGrpcServer(options_.admin_listen, admin_service_.get(),
                      "admin service", /*ready=*/false));
  admin_health_ = std::move(started.health);
  admin_ = std::move(started.server);
  admin_port_ = started.port;

  DP_ASSIGN_OR_RETURN(proto::RegisterReply reply,
                      scheduler_.Register(RegisterRequest(),
                                          options_.connect_timeout));
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
                                     id_);
  dispatcher_ = std::make_unique<Dispatcher>(id_, options_.max_message_bytes,
                                             &pool_, &plugins_, pins,
                                             env_.get(),
                                             options_.max_table_bytes);
  admin_service_->set_dispatcher(dispatcher_.get());
  DP_LOG(INFO) << "registered with scheduler " << options_.scheduler_address
               << " as node " << id_ << "; data plane " << endpoint_
               << ", admin 127.0.0.1:" << admin_port_;

  data_->Start([d = dispatcher_.get(), data = data_.get()](
                   const IncomingMessage& req, OutgoingReply* rep) {
    // Empty (no allocation) unless a BSP step answers PushPulls that were
    // waiting for it.
    std::vector<DeferredReply> released;
    d->Handle(req, rep, &released);
    for (DeferredReply& r : released) data->SendDeferred(std::move(r));
  });
  ApplyAndAck(reply.map());
  watch_thread_ = std::thread([this] { WatchLoop(); });
  heartbeat_thread_ = std::thread([this] { HeartbeatLoop(); });
  // Registered and serving its ranges: a Kubernetes readiness probe passes.
  admin_health_->SetReady(true);
  return absl::OkStatus();
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
  if (!status->ok()) DP_LOG(ERROR) << "epoch " << map.epoch() << ": " << *status;
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
  while (!stop_.WaitForNotificationWithTimeout(heartbeat_interval_)) {
    auto reply = scheduler_.Heartbeat(id_, reportable_epoch_.load());
    if (reply.ok()) continue;
    const absl::StatusCode code = reply.status().code();
    if (code != absl::StatusCode::kFailedPrecondition &&
        code != absl::StatusCode::kNotFound) {
      DP_LOG(WARNING) << reply.status();
      continue;
    }
    // Declared dead (e.g. after a long pause) or unknown to a restarted
    // scheduler: register again under the same name.
    DP_LOG(WARNING) << reply.status() << "; registering again";
    auto again = scheduler_.Register(RegisterRequest(), absl::Seconds(5));
    if (!again.ok()) {
      DP_LOG(WARNING) << again.status();
    } else if (again->node_id() != id_) {
      Fail(absl::AbortedError(absl::StrCat(
          "the scheduler registered this server as node ", again->node_id(),
          " instead of ", id_, "; its data no longer matches the map")));
      return;
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
