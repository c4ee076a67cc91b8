#include "common/grpc_server.h"

#include <grpc/grpc.h>
#include <grpc/grpc_security.h>

#include <cstdlib>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "grpcpp/ext/proto_server_reflection_plugin.h"

namespace downpour {
namespace {

// Kubernetes probes call this without credentials.
constexpr absl::string_view kHealthServicePrefix = "/grpc.health.v1.Health/";

absl::string_view View(const grpc_slice& s) {
  return absl::string_view(
      reinterpret_cast<const char*>(GRPC_SLICE_START_PTR(s)),
      GRPC_SLICE_LENGTH(s));
}

// gRPC core's authentication metadata processor: runs for every call on the
// server's transport, before the call reaches any service. Non-blocking
// (a comparison), so it runs inline.
void CheckCallToken(void* state, grpc_auth_context* /*context*/,
                    const grpc_metadata* md, size_t num_md,
                    grpc_process_auth_metadata_done_cb done, void* user_data) {
  const auto* auth = static_cast<const ClusterAuth*>(state);
  absl::string_view path, token;
  const grpc_metadata* token_md = nullptr;
  for (size_t i = 0; i < num_md; ++i) {
    const absl::string_view key = View(md[i].key);
    if (key == ":path") path = View(md[i].value);
    if (key == "authorization") {
      token = View(md[i].value);
      token_md = &md[i];
    }
  }
  if (absl::StartsWith(path, kHealthServicePrefix)) {
    done(user_data, nullptr, 0, nullptr, 0, GRPC_STATUS_OK, nullptr);
    return;
  }
  const absl::Status s = auth->CheckToken(token);
  if (!s.ok()) {
    const std::string message =
        absl::StrCat("call to ", path, " ", s.message());
    done(user_data, nullptr, 0, nullptr, 0, GRPC_STATUS_UNAUTHENTICATED,
         message.c_str());
    return;
  }
  // Consumed: services never see the token.
  done(user_data, token_md, token_md != nullptr ? 1 : 0, nullptr, 0,
       GRPC_STATUS_OK, nullptr);
}

void DestroyAuth(void* state) { delete static_cast<ClusterAuth*>(state); }

// Server credentials from gRPC core's, because grpc++'s
// InsecureServerCredentials() cannot take an AuthMetadataProcessor (it
// aborts): core's insecure and SSL credentials both run the processor, so
// the token is checked in the transport with or without TLS.
class CoreServerCredentials final : public grpc::ServerCredentials {
 public:
  // Takes ownership of `creds`.
  explicit CoreServerCredentials(grpc_server_credentials* creds)
      : creds_(creds) {}
  ~CoreServerCredentials() override { grpc_server_credentials_release(creds_); }

  // Not used: the processor is installed on the core credentials.
  void SetAuthMetadataProcessor(
      const std::shared_ptr<grpc::AuthMetadataProcessor>&) override {
    DP_LOG(ERROR) << "CoreServerCredentials::SetAuthMetadataProcessor: unused";
    std::abort();
  }

 private:
  int AddPortToServer(const std::string& addr, grpc_server* server) override {
    return grpc_server_add_http2_port(server, addr.c_str(), creds_);
  }

  grpc_server_credentials* const creds_;
};

std::shared_ptr<grpc::ServerCredentials> MakeCredentials(
    const ClusterAuth& auth) {
  grpc_server_credentials* creds;
  if (auth.tls_enabled()) {
    const TlsMaterial& tls = auth.tls();
    grpc_ssl_pem_key_cert_pair pair = {tls.key_pem.c_str(),
                                       tls.cert_pem.c_str()};
    creds = grpc_ssl_server_credentials_create_ex(
        tls.mutual ? tls.ca_pem.c_str() : nullptr, &pair, 1,
        tls.mutual ? GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY
                   : GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE,
        nullptr);
  } else {
    creds = grpc_insecure_server_credentials_create();
  }
  if (auth.enabled()) {
    grpc_auth_metadata_processor processor = {CheckCallToken, DestroyAuth,
                                              new ClusterAuth(auth)};
    grpc_server_credentials_set_auth_metadata_processor(creds, processor);
  }
  return std::make_shared<CoreServerCredentials>(creds);
}

}  // namespace

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
    const std::string& what, const ClusterAuth& auth, bool ready) {
  // Core credentials are made outside grpc++'s objects: keep the library
  // initialized meanwhile (reference-counted; the server holds its own).
  grpc_init();
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
  builder.AddListeningPort(listen_address, MakeCredentials(auth),
                           &started.port);
  if (service != nullptr) builder.RegisterService(service);
  builder.RegisterService(started.health.get());
  started.server = builder.BuildAndStart();
  grpc_shutdown();
  if (started.server == nullptr || started.port == 0) {
    return absl::UnavailableError(
        absl::StrCat("cannot bind ", what, " to ", listen_address,
                     auth.tls_enabled() ? " with TLS" : ""));
  }
  return started;
}

HealthEndpoint::~HealthEndpoint() {
  if (started_.server != nullptr) {
    started_.server->Shutdown(gpr_now(GPR_CLOCK_MONOTONIC));
  }
}

absl::Status HealthEndpoint::Start(const std::string& listen_address,
                                   const std::string& what) {
  if (listen_address.empty()) return absl::OkStatus();
  absl::StatusOr<StartedGrpcServer> started = StartGrpcServer(
      listen_address, nullptr, what, ClusterAuth(), /*ready=*/false);
  if (!started.ok()) return started.status();
  started_ = std::move(*started);
  return absl::OkStatus();
}

void HealthEndpoint::SetReady(bool ready) {
  if (started_.health != nullptr) started_.health->SetReady(ready);
}

}  // namespace downpour
