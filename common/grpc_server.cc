#include "common/grpc_server.h"

#include "absl/strings/str_cat.h"

namespace downpour {

absl::StatusOr<StartedGrpcServer> StartGrpcServer(
    const std::string& listen_address, grpc::Service* service,
    const std::string& what) {
  StartedGrpcServer started;
  grpc::ServerBuilder builder;
  builder.AddListeningPort(listen_address, grpc::InsecureServerCredentials(),
                           &started.port);
  builder.RegisterService(service);
  started.server = builder.BuildAndStart();
  if (started.server == nullptr || started.port == 0) {
    return absl::UnavailableError(
        absl::StrCat("cannot bind ", what, " to ", listen_address));
  }
  return started;
}

}  // namespace downpour
