#include "common/auth.h"

#include <openssl/evp.h>
#include <zmq.h>

#include <fstream>
#include <sstream>

#include "absl/flags/flag.h"
#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "grpcpp/grpcpp.h"

ABSL_FLAG(std::string, cluster_secret_file, "",
          "file holding the cluster's shared secret (made by ps_keygen); "
          "when set, the data plane uses CURVE and gRPC calls carry a token "
          "derived from it. Empty: no authentication.");

namespace downpour {
namespace {

constexpr char kMetadataKey[] = "authorization";
constexpr char kTokenPrefix[] = "Downpour ";

std::string Sha256Hex(absl::string_view data) {
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  EVP_Digest(data.data(), data.size(), digest, &len, EVP_sha256(), nullptr);
  return absl::BytesToHexString(
      absl::string_view(reinterpret_cast<const char*>(digest), len));
}

// Constant-time so that the time of a rejection says nothing about how
// much of a guessed token was right.
bool SameBytes(absl::string_view a, absl::string_view b) {
  if (a.size() != b.size()) return false;
  unsigned char diff = 0;
  for (size_t i = 0; i < a.size(); ++i) diff |= a[i] ^ b[i];
  return diff == 0;
}

}  // namespace

absl::StatusOr<ClusterAuth> ClusterAuth::FromSecret(
    absl::string_view z85_secret) {
  if (!zmq_has("curve")) {
    return absl::UnimplementedError(
        "this libzmq was built without CURVE security");
  }
  if (z85_secret.size() != 40) {
    return absl::InvalidArgumentError(absl::StrCat(
        "cluster secret must be a 40-character Z85 key (from ps_keygen), got ",
        z85_secret.size(), " characters"));
  }
  ClusterAuth auth;
  auth.secret_ = std::string(z85_secret);
  char public_key[41];
  if (zmq_curve_public(public_key, auth.secret_.c_str()) != 0) {
    return absl::InvalidArgumentError(
        "cluster secret is not a valid Z85 CURVE key");
  }
  auth.public_ = public_key;
  auth.token_ = absl::StrCat(
      kTokenPrefix, Sha256Hex(absl::StrCat("downpour control plane\n",
                                           auth.secret_)));
  return auth;
}

absl::StatusOr<ClusterAuth> ClusterAuth::FromFile(const std::string& path) {
  std::ifstream in(path);
  if (!in) {
    return absl::NotFoundError(
        absl::StrCat("cannot read cluster secret file ", path));
  }
  std::stringstream ss;
  ss << in.rdbuf();
  auto auth = FromSecret(absl::StripAsciiWhitespace(ss.str()));
  if (!auth.ok()) {
    return absl::Status(auth.status().code(),
                        absl::StrCat(path, ": ", auth.status().message()));
  }
  return auth;
}

absl::StatusOr<ClusterAuth> ClusterAuth::FromFlags() {
  const std::string path = absl::GetFlag(FLAGS_cluster_secret_file);
  if (path.empty()) return ClusterAuth();
  auto auth = FromFile(path);
  if (auth.ok()) DP_LOG(INFO) << "cluster authentication on (" << path << ")";
  return auth;
}

absl::StatusOr<std::string> ClusterAuth::NewSecret() {
  char public_key[41], secret_key[41];
  if (zmq_curve_keypair(public_key, secret_key) != 0) {
    return absl::UnimplementedError(absl::StrCat(
        "cannot make a CURVE key pair: ", zmq_strerror(zmq_errno())));
  }
  return std::string(secret_key);
}

void ClusterAuth::Attach(grpc::ClientContext* context) const {
  if (enabled()) context->AddMetadata(kMetadataKey, token_);
}

grpc::Status ClusterAuth::Check(const grpc::ServerContext* context) const {
  if (!enabled()) return grpc::Status::OK;
  const auto& metadata = context->client_metadata();
  auto it = metadata.find(kMetadataKey);
  if (it == metadata.end()) {
    return grpc::Status(grpc::StatusCode::UNAUTHENTICATED,
                        absl::StrCat("call from ", context->peer(),
                                     " carries no cluster token"));
  }
  if (!SameBytes(absl::string_view(it->second.data(), it->second.size()),
                 token_)) {
    return grpc::Status(grpc::StatusCode::UNAUTHENTICATED,
                        absl::StrCat("call from ", context->peer(),
                                     " carries a wrong cluster token"));
  }
  return grpc::Status::OK;
}

}  // namespace downpour
