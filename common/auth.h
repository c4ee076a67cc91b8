// Cluster security: one shared secret, and TLS for gRPC.
//
// The secret (a file given to every node: scheduler, servers, workers,
// coordinator, SDK programs; made by ps_keygen) protects both planes:
//  - the data plane uses ZeroMQ's CURVE security: the secret is a CURVE
//    secret key; servers take its key pair as theirs, clients present the
//    same key pair, and a server admits a client only if it proves that it
//    holds the secret (its public key is the cluster's). Traffic is then
//    encrypted and authenticated. A peer without the secret fails the
//    handshake and never reaches the request handler.
//  - the control plane (gRPC) carries a bearer token, an HMAC-SHA256 keyed
//    by the secret (so it does not reveal the data-plane key), in the
//    "authorization" metadata of every call. Channels made by NewGrpcChannel
//    (common/grpc_channel.h) attach it; servers started by StartGrpcServer
//    (common/grpc_server.h) refuse calls without it with UNAUTHENTICATED,
//    except the standard health service.
// TLS (TlsFiles, independent of the secret) encrypts gRPC and authenticates
// servers by certificate; with `mutual`, servers demand client certificates
// too. Without TLS the token travels in clear text: see docs/ARCHITECTURE.md
// ("Authentication") for what each plane is protected by.
//
// A default-constructed ClusterAuth is "off": plain gRPC, no token, no
// CURVE, which is what local tests and the demo use. Cheap to copy;
// immutable, so thread-safe.
#ifndef DOWNPOUR_COMMON_AUTH_H_
#define DOWNPOUR_COMMON_AUTH_H_

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace downpour {

// Where a node's TLS material lives (the daemons' --tls_* flags). Any field
// set turns TLS on; ClusterAuth::Load then insists on a complete set.
struct TlsFiles {
  // PEM certificate(s) of the CA that signed the cluster's certificates:
  // verifies servers, and clients under `mutual`.
  std::string ca_file;
  std::string cert_file;  // PEM: this node's certificate (chain)
  std::string key_file;   // PEM: its private key
  // Servers demand a client certificate signed by ca_file; clients present
  // cert_file.
  bool mutual = false;
  // The name expected in servers' certificates instead of the host part of
  // the address dialled (one name for a whole cluster; empty: the host).
  std::string server_name;

  bool enabled() const {
    return !ca_file.empty() || !cert_file.empty() || !key_file.empty() ||
           mutual || !server_name.empty();
  }
  // The same settings as daemon flags ("--tls_ca_file=...", ...), for
  // starting daemons; empty when off.
  std::vector<std::string> ToFlags() const;
};

// Which ends of gRPC a node runs, i.e. which TLS pieces it needs: a server
// presents a certificate (and, under mutual TLS, verifies clients with the
// CA); a client verifies servers with the CA (and, under mutual TLS,
// presents a certificate).
enum GrpcEnds { kGrpcClient = 1, kGrpcServer = 2, kGrpcClientAndServer = 3 };

// TLS material read from TlsFiles (PEM text).
struct TlsMaterial {
  std::string ca_pem;
  std::string cert_pem;
  std::string key_pem;
  bool mutual = false;
  std::string server_name;
};

// Whether `presented` equals `expected`, in constant time for strings of
// the expected length (OpenSSL's CRYPTO_memcmp), so that the time of a
// refusal says nothing about how much of a guessed secret was right; the
// length is public. Every comparison of a secret, token or HMAC uses it.
bool SecretsEqual(absl::string_view presented, absl::string_view expected);

class ClusterAuth {
 public:
  ClusterAuth() = default;  // off

  // `z85_secret` is a 40-character Z85 CURVE secret key (as written by
  // ps_keygen); TLS off. kInvalidArgument if it is not one; kUnimplemented
  // if this libzmq was built without CURVE.
  static absl::StatusOr<ClusterAuth> FromSecret(absl::string_view z85_secret);
  // Reads the secret from a file (surrounding whitespace ignored). kNotFound
  // if it cannot be read; errors name the file.
  static absl::StatusOr<ClusterAuth> FromFile(const std::string& path);
  // The secret from `secret_file` (none if empty) and TLS from `tls` (off if
  // !tls.enabled()), for a node that runs gRPC `ends`. Refuses half a TLS
  // configuration: kInvalidArgument naming every missing flag and why it is
  // needed. kNotFound for a file that cannot be read; kInvalidArgument for
  // one that is not PEM of the right kind, a key that does not belong to its
  // certificate, or an expired certificate (each naming the file).
  static absl::StatusOr<ClusterAuth> Load(const std::string& secret_file,
                                          const TlsFiles& tls, GrpcEnds ends);
  // Load() from the --cluster_secret_file and --tls_* flags that every
  // daemon links in (call from main() only). Logs what is on.
  static absl::StatusOr<ClusterAuth> FromFlags(GrpcEnds ends);
  // The TlsFiles the --tls_* flags name (call from main() only).
  static TlsFiles TlsFilesFromFlags();
  // A fresh random secret in Z85, for a new cluster.
  static absl::StatusOr<std::string> NewSecret();

  // A secret is set: CURVE on the data plane, the token on gRPC.
  bool enabled() const { return !secret_.empty(); }
  // Z85 keys for ZeroMQ's ZMQ_CURVE_* options (empty when off).
  const std::string& curve_secret_key() const { return secret_; }
  const std::string& curve_public_key() const { return public_; }

  // The value of the "authorization" metadata ("Downpour <hex HMAC>"); empty
  // without a secret.
  const std::string& token() const { return token_; }
  // OK when no secret is set or `presented` is the token (compared in
  // constant time); kUnauthenticated otherwise.
  absl::Status CheckToken(absl::string_view presented) const;

  // gRPC runs over TLS with tls() (PEM text read by Load).
  bool tls_enabled() const { return tls_enabled_; }
  const TlsMaterial& tls() const { return tls_; }

 private:
  std::string secret_;
  std::string public_;
  std::string token_;
  bool tls_enabled_ = false;
  TlsMaterial tls_;
};

}  // namespace downpour

#endif  // DOWNPOUR_COMMON_AUTH_H_
