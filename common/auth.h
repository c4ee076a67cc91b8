// Cluster authentication from one shared secret.
//
// Every node of a cluster (scheduler, servers, workers, coordinator, SDK
// programs) is given the same secret file. From it:
//  - the data plane uses ZeroMQ's CURVE security: the secret is a CURVE
//    secret key; servers take its key pair as theirs, clients present the
//    same key pair, and a server admits a client only if it proves that it
//    holds the secret (its public key is the cluster's). Traffic is then
//    encrypted and authenticated. A peer without the secret fails the
//    handshake and never reaches the request handler.
//  - the control plane (gRPC) carries a bearer token derived from the
//    secret (SHA-256, so the token does not reveal the data-plane key) in
//    the "authorization" metadata of every call; services answer
//    UNAUTHENTICATED without it. The channel itself is not encrypted: see
//    docs/ARCHITECTURE.md ("Authentication") for what that leaves open.
//
// A default-constructed ClusterAuth is "off": nothing is checked, which is
// what local tests and the demo use.
#ifndef DOWNPOUR_COMMON_AUTH_H_
#define DOWNPOUR_COMMON_AUTH_H_

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace grpc {
class ClientContext;
class ServerContext;
class Status;
}  // namespace grpc

namespace downpour {

class ClusterAuth {
 public:
  ClusterAuth() = default;  // off

  // `z85_secret` is a 40-character Z85 CURVE secret key (as written by
  // ps_keygen). kInvalidArgument if it is not one; kUnimplemented if this
  // libzmq was built without CURVE.
  static absl::StatusOr<ClusterAuth> FromSecret(absl::string_view z85_secret);
  // Reads the secret from a file (surrounding whitespace ignored).
  static absl::StatusOr<ClusterAuth> FromFile(const std::string& path);
  // From the --cluster_secret_file flag that every daemon links in; off when
  // the flag is empty. Logs that authentication is on.
  static absl::StatusOr<ClusterAuth> FromFlags();
  // A fresh random secret in Z85, for a new cluster.
  static absl::StatusOr<std::string> NewSecret();

  bool enabled() const { return !secret_.empty(); }
  // Z85 keys for ZeroMQ's ZMQ_CURVE_* options (empty when off).
  const std::string& curve_secret_key() const { return secret_; }
  const std::string& curve_public_key() const { return public_; }

  // Adds the token to an outgoing gRPC call (no-op when off).
  void Attach(grpc::ClientContext* context) const;
  // OK when off or when the call carries the token; UNAUTHENTICATED
  // otherwise (compared in constant time).
  grpc::Status Check(const grpc::ServerContext* context) const;

 private:
  std::string secret_;
  std::string public_;
  std::string token_;
};

}  // namespace downpour

#endif  // DOWNPOUR_COMMON_AUTH_H_
