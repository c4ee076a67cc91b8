// Starting a gRPC server the way every daemon here does: one listening
// address (port 0 picks a free one), insecure transport (see
// docs/ARCHITECTURE.md, "Authentication"), the standard health service
// (grpc.health.v1.Health), server reflection (grpc.reflection.v1alpha, so
// that grpcurl can list and call the services), and an absl::Status when
// the address cannot be bound.
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
// service alone) and starts serving on `listen_address`, with readiness
// `ready` from the first request on. The caller keeps `health` as long as
// `server`. kUnavailable naming `what` and the address if it cannot listen.
absl::StatusOr<StartedGrpcServer> StartGrpcServer(
    const std::string& listen_address, grpc::Service* service,
    const std::string& what, bool ready = true);

}  // namespace downpour

#endif  // DOWNPOUR_COMMON_GRPC_SERVER_H_
