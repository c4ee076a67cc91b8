// Starting a gRPC server the way every daemon here does: one listening
// address (port 0 picks a free one), insecure transport (see
// docs/ARCHITECTURE.md, "Authentication"), and an absl::Status when the
// address cannot be bound.
#ifndef DOWNPOUR_COMMON_GRPC_SERVER_H_
#define DOWNPOUR_COMMON_GRPC_SERVER_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "grpcpp/grpcpp.h"

namespace downpour {

struct StartedGrpcServer {
  std::unique_ptr<grpc::Server> server;
  int port = 0;  // the bound port
};

// Registers `service` (which must outlive the server) and starts serving on
// `listen_address`. kUnavailable naming `what` and the address if it cannot
// listen.
absl::StatusOr<StartedGrpcServer> StartGrpcServer(
    const std::string& listen_address, grpc::Service* service,
    const std::string& what);

}  // namespace downpour

#endif  // DOWNPOUR_COMMON_GRPC_SERVER_H_
