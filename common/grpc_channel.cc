#include "common/grpc_channel.h"

#include <memory>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "grpcpp/support/client_interceptor.h"

namespace downpour {
namespace {

using grpc::experimental::ClientInterceptorFactoryInterface;
using grpc::experimental::ClientRpcInfo;
using grpc::experimental::InterceptionHookPoints;
using grpc::experimental::Interceptor;
using grpc::experimental::InterceptorBatchMethods;

// Adds the token to every call and the likely cause to a failed connection.
class SecurityInterceptor final : public Interceptor {
 public:
  explicit SecurityInterceptor(std::shared_ptr<const ClusterAuth> auth)
      : auth_(std::move(auth)) {}

  void Intercept(InterceptorBatchMethods* methods) override {
    if (methods->QueryInterceptionHookPoint(
            InterceptionHookPoints::PRE_SEND_INITIAL_METADATA) &&
        auth_->enabled()) {
      methods->GetSendInitialMetadata()->emplace("authorization",
                                                 auth_->token());
    }
    if (methods->QueryInterceptionHookPoint(
            InterceptionHookPoints::POST_RECV_STATUS)) {
      grpc::Status* status = methods->GetRecvStatus();
      const std::string hint =
          SecurityHint(*auth_, status->error_code(), status->error_message());
      if (!hint.empty()) {
        *status =
            grpc::Status(status->error_code(), status->error_message() + hint,
                         status->error_details());
      }
    }
    methods->Proceed();
  }

 private:
  const std::shared_ptr<const ClusterAuth> auth_;
};

class SecurityInterceptorFactory final
    : public ClientInterceptorFactoryInterface {
 public:
  explicit SecurityInterceptorFactory(const ClusterAuth& auth)
      : auth_(std::make_shared<const ClusterAuth>(auth)) {}
  Interceptor* CreateClientInterceptor(ClientRpcInfo*) override {
    return new SecurityInterceptor(auth_);
  }

 private:
  const std::shared_ptr<const ClusterAuth> auth_;
};

}  // namespace

std::string SecurityHint(const ClusterAuth& auth, grpc::StatusCode code,
                         absl::string_view message) {
  // Only failures to set up a connection: a call cut later is something
  // else (a server going away).
  if (code != grpc::StatusCode::UNAVAILABLE ||
      !absl::StrContains(message, "failed to connect")) {
    return "";
  }
  if (absl::StrContains(message, "certificate verify failed")) {
    return " (this node does not trust the server's certificate: it must be "
           "signed by the CA in --tls_ca_file)";
  }
  if (absl::StrContains(message, "not in peer certificate")) {
    return " (the server's certificate does not name the host dialled: add "
           "it to the certificate, or give --tls_server_name a name the "
           "certificate has)";
  }
  if (absl::StrContains(message, "wrong version number")) {
    return " (the server does not speak TLS: start it with --tls_cert_file "
           "and --tls_key_file, or this node without --tls_* flags)";
  }
  if (absl::StrContains(message, "Socket closed") ||
      absl::StrContains(message, "Connection reset")) {
    if (!auth.tls_enabled()) {
      return " (the server closed a plaintext connection: if it serves TLS, "
             "give this node --tls_ca_file)";
    }
    if (auth.tls().cert_pem.empty()) {
      return " (the server closed the connection after the TLS handshake: "
             "if it demands client certificates (--tls_mutual), give this "
             "node --tls_cert_file and --tls_key_file)";
    }
    return " (the server closed the connection after the TLS handshake: if "
           "it demands client certificates, it did not accept this node's "
           "--tls_cert_file: is it signed by the server's CA?)";
  }
  if (absl::StrContains(message, "handshake failed") ||
      absl::StrContains(message, "Handshake failed")) {
    return " (TLS handshake failed: check --tls_ca_file and the server's "
           "certificate)";
  }
  return "";
}

std::shared_ptr<grpc::Channel> NewGrpcChannel(const std::string& target,
                                              const ClusterAuth& auth,
                                              int max_receive_bytes) {
  std::shared_ptr<grpc::ChannelCredentials> creds;
  grpc::ChannelArguments args;
  if (max_receive_bytes > 0) args.SetMaxReceiveMessageSize(max_receive_bytes);
  if (auth.tls_enabled()) {
    const TlsMaterial& tls = auth.tls();
    grpc::SslCredentialsOptions ssl;
    ssl.pem_root_certs = tls.ca_pem;
    ssl.pem_private_key = tls.key_pem;
    ssl.pem_cert_chain = tls.cert_pem;
    creds = grpc::SslCredentials(ssl);
    if (!tls.server_name.empty()) {
      args.SetSslTargetNameOverride(tls.server_name);
    }
  } else {
    creds = grpc::InsecureChannelCredentials();
  }
  std::vector<std::unique_ptr<ClientInterceptorFactoryInterface>> interceptors;
  interceptors.push_back(std::make_unique<SecurityInterceptorFactory>(auth));
  return grpc::experimental::CreateCustomChannelWithInterceptors(
      target, creds, args, std::move(interceptors));
}

}  // namespace downpour
