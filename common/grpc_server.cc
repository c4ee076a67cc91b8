#include "common/grpc_server.h"

#include "absl/strings/str_cat.h"
#include "grpcpp/ext/proto_server_reflection_plugin.h"

namespace downpour {

void HealthService::SetReady(bool ready) {
  absl::MutexLock lock(&mu_);
  ready_ = ready;
}

grpc::Status HealthService::Check(
    grpc::ServerContext*, const grpc::health::v1::HealthCheckRequest* request,
    grpc::health::v1::HealthCheckResponse* response) {
  using Response = grpc::health::v1::HealthCheckResponse;
  if (request->service() == kLivenessService) {
    response->set_status(Response::SERVING);
    return grpc::Status::OK;
  }
  if (!request->service().empty()) {
    return grpc::Status(grpc::StatusCode::NOT_FOUND,
                        absl::StrCat("no service '", request->service(), "'"));
  }
  absl::MutexLock lock(&mu_);
  response->set_status(ready_ ? Response::SERVING : Response::NOT_SERVING);
  return grpc::Status::OK;
}

absl::StatusOr<StartedGrpcServer> StartGrpcServer(
    const std::string& listen_address, grpc::Service* service,
    const std::string& what, bool ready) {
  // Server reflection on every daemon, so that grpcurl and other generic
  // clients can list and call the services. The plugin is registered once
  // per process; every server built afterwards carries it.
  static const bool reflection = [] {
    grpc::reflection::InitProtoReflectionServerBuilderPlugin();
    return true;
  }();
  (void)reflection;
  StartedGrpcServer started;
  started.health = std::make_unique<HealthService>(ready);
  grpc::ServerBuilder builder;
  builder.AddListeningPort(listen_address, grpc::InsecureServerCredentials(),
                           &started.port);
  if (service != nullptr) builder.RegisterService(service);
  builder.RegisterService(started.health.get());
  started.server = builder.BuildAndStart();
  if (started.server == nullptr || started.port == 0) {
    return absl::UnavailableError(
        absl::StrCat("cannot bind ", what, " to ", listen_address));
  }
  return started;
}

}  // namespace downpour
