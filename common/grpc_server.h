// Starting a gRPC server the way every daemon here does (the scheduler, a
// server's admin service, the L-BFGS coordinator): one listening address
// (port 0 picks a free one), the cluster's security applied to every call,
// and an absl::Status when the address cannot be bound.
//
// Security lives here so that a service, or a new RPC, cannot forget it:
//  - TLS when `auth.tls_enabled()`: the node's certificate and key; under
//    mutual TLS, clients must present a certificate signed by the CA (the
//    handshake fails otherwise, and the call never reaches the service).
//  - the cluster token when `auth.enabled()`: an authentication metadata
//    processor checks the "authorization" metadata of every call before any
//    service code runs, and answers UNAUTHENTICATED ("call to <method>
//    carries no / a wrong cluster token"). The standard health service
//    (grpc.health.v1.Health) stays open for Kubernetes probes.
// See docs/ARCHITECTURE.md ("Authentication").
#ifndef DOWNPOUR_COMMON_GRPC_SERVER_H_
#define DOWNPOUR_COMMON_GRPC_SERVER_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "common/auth.h"
#include "grpcpp/grpcpp.h"

namespace downpour {

struct StartedGrpcServer {
  std::unique_ptr<grpc::Server> server;
  int port = 0;  // the bound port
};

// Registers `service` (which must outlive the server) and starts serving on
// `listen_address` with `auth` applied to every call. kUnavailable naming
// `what` and the address if it cannot listen (or TLS cannot be set up with
// the given certificate).
absl::StatusOr<StartedGrpcServer> StartGrpcServer(
    const std::string& listen_address, grpc::Service* service,
    const std::string& what, const ClusterAuth& auth);

}  // namespace downpour

#endif  // DOWNPOUR_COMMON_GRPC_SERVER_H_
