// Starting a gRPC server the way every daemon here does (the scheduler, a
// server's admin service, the L-BFGS coordinator, a worker's health port):
// one listening address (port 0 picks a free one), the cluster's security
// applied to every call, the standard health service
// (grpc.health.v1.Health), server reflection (grpc.reflection.v1alpha, so
// that grpcurl can list and call the services; it needs the cluster token
// like any other call), and an absl::Status when the address cannot be
// bound.
//
// Security lives here so that a service, or a new RPC, cannot forget it:
//  - TLS when `auth.tls_enabled()`: the node's certificate and key; under
//    mutual TLS, clients must present a certificate signed by the CA (the
//    handshake fails otherwise, and the call never reaches the service).
//  - the cluster token when `auth.enabled()`: an authentication metadata
//    processor checks the "authorization" metadata of every call before any
//    service code runs, and answers UNAUTHENTICATED ("call to <method>
//    carries no / a wrong cluster token"). The health service stays open
//    (no token) for Kubernetes probes.
// See docs/ARCHITECTURE.md ("Authentication").
//
// Health, as Kubernetes' gRPC probes read it: the overall service "" (what
// a probe asks when it names none) is readiness, as the daemon sets it;
// kLivenessService is liveness, SERVING while the server runs, so that a
// daemon still waiting for its peers is not restarted. Other names are
// NOT_FOUND.
#ifndef DOWNPOUR_COMMON_GRPC_SERVER_H_
#define DOWNPOUR_COMMON_GRPC_SERVER_H_

#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "common/auth.h"
#include "grpcpp/grpcpp.h"
#include "proto/health.grpc.pb.h"

namespace downpour {

inline constexpr char kLivenessService[] = "liveness";

// grpc.health.v1.Health: Check as above; Watch answers UNIMPLEMENTED (probes
// use Check). Thread-safe.
class HealthService final : public grpc::health::v1::Health::Service {
 public:
  explicit HealthService(bool ready) : ready_(ready) {}
  void SetReady(bool ready) ABSL_LOCKS_EXCLUDED(mu_);
  grpc::Status Check(grpc::ServerContext* ctx,
                     const grpc::health::v1::HealthCheckRequest* request,
                     grpc::health::v1::HealthCheckResponse* response) override;

 private:
  absl::Mutex mu_;
  bool ready_ ABSL_GUARDED_BY(mu_);
};

struct StartedGrpcServer {
  // Declared before `server`, which uses it: destroyed after it.
  std::unique_ptr<HealthService> health;
  std::unique_ptr<grpc::Server> server;
  int port = 0;  // the bound port
};

// Registers `service` (which must outlive the server; nullptr: the health
// service alone) and starts serving on `listen_address` with `auth` applied
// to every call, and readiness `ready` from the first request on. The
// caller keeps `health` as long as `server`. kUnavailable naming `what` and
// the address if it cannot listen (or TLS cannot be set up with the given
// certificate).
absl::StatusOr<StartedGrpcServer> StartGrpcServer(
    const std::string& listen_address, grpc::Service* service,
    const std::string& what, const ClusterAuth& auth, bool ready = true);

// The health port of a process that serves nothing else (ps_worker, a
// Sandblaster worker): plain text and no token, since Kubernetes' gRPC
// probes speak neither TLS nor the token, and it serves nothing but health.
// Not ready until SetReady(true); shut down when destroyed. Thread-
// compatible: started once, before SetReady.
class HealthEndpoint {
 public:
  HealthEndpoint() = default;
  HealthEndpoint(const HealthEndpoint&) = delete;
  HealthEndpoint& operator=(const HealthEndpoint&) = delete;
  ~HealthEndpoint();

  // Serves on `listen_address`; an empty address serves nothing (OK).
  // kUnavailable naming `what` if it cannot listen.
  absl::Status Start(const std::string& listen_address,
                     const std::string& what);
  // No-op unless started.
  void SetReady(bool ready);

 private:
  StartedGrpcServer started_;
};

}  // namespace downpour

#endif  // DOWNPOUR_COMMON_GRPC_SERVER_H_
