#include "common/auth.h"

#include <openssl/bio.h>
#include <openssl/crypto.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <zmq.h>

#include <fstream>
#include <memory>
#include <sstream>

#include "absl/flags/flag.h"
#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/logging.h"
#include "common/status_macros.h"

ABSL_FLAG(std::string, cluster_secret_file, "",
          "file holding the cluster's shared secret (made by ps_keygen); "
          "when set, the data plane uses CURVE and gRPC calls carry a token "
          "derived from it. Empty: no authentication.");
ABSL_FLAG(std::string, tls_ca_file, "",
          "PEM certificate of the CA that signed the cluster's certificates: "
          "gRPC then runs over TLS and verifies servers (and, with "
          "--tls_mutual, clients) against it");
ABSL_FLAG(std::string, tls_cert_file, "",
          "PEM certificate of this node: served by its gRPC services and, "
          "with --tls_mutual, presented to the others");
ABSL_FLAG(std::string, tls_key_file, "", "PEM private key of --tls_cert_file");
ABSL_FLAG(bool, tls_mutual, false,
          "mutual TLS: gRPC services demand a client certificate signed by "
          "--tls_ca_file, and this node presents --tls_cert_file");
ABSL_FLAG(std::string, tls_server_name, "",
          "name expected in servers' certificates instead of the host of the "
          "address dialled (e.g. one name shared by the whole cluster)");

namespace downpour {
namespace {

constexpr char kTokenPrefix[] = "Downpour ";
// What the control-plane token authenticates; a new version of the token
// scheme gets a new label, so old and new tokens never match.
constexpr char kTokenLabel[] = "downpour control plane token v1";

// HMAC-SHA256 of the label keyed by the secret: the token proves the secret
// without revealing it (or the CURVE key it is).
absl::StatusOr<std::string> DeriveToken(absl::string_view secret) {
  unsigned char mac[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  if (HMAC(EVP_sha256(), secret.data(), static_cast<int>(secret.size()),
           reinterpret_cast<const unsigned char*>(kTokenLabel),
           sizeof(kTokenLabel) - 1, mac, &len) == nullptr) {
    return absl::InternalError("HMAC-SHA256 of the control-plane token failed");
  }
  return absl::StrCat(kTokenPrefix,
                      absl::BytesToHexString(absl::string_view(
                          reinterpret_cast<const char*>(mac), len)));
}

// OpenSSL's reason for the last failure, or `fallback`.
std::string OpenSslError(absl::string_view fallback) {
  const unsigned long e = ERR_get_error();
  ERR_clear_error();
  if (e == 0) return std::string(fallback);
  char buf[256];
  ERR_error_string_n(e, buf, sizeof(buf));
  return buf;
}

absl::StatusOr<std::string> ReadFile(const std::string& path,
                                     absl::string_view what) {
  std::ifstream in(path);
  if (!in) {
    return absl::NotFoundError(absl::StrCat("cannot read ", what, " ", path));
  }
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

struct BioFree {
  void operator()(BIO* b) const { BIO_free(b); }
};
struct X509Free {
  void operator()(X509* x) const { X509_free(x); }
};
struct PkeyFree {
  void operator()(EVP_PKEY* k) const { EVP_PKEY_free(k); }
};
using X509Ptr = std::unique_ptr<X509, X509Free>;

std::unique_ptr<BIO, BioFree> MemBio(const std::string& pem) {
  return std::unique_ptr<BIO, BioFree>(
      BIO_new_mem_buf(pem.data(), static_cast<int>(pem.size())));
}

// The first certificate of a PEM text; kInvalidArgument naming `path`.
absl::StatusOr<X509Ptr> FirstCertificate(const std::string& pem,
                                         const std::string& path,
                                         absl::string_view flag) {
  auto bio = MemBio(pem);
  X509Ptr cert(PEM_read_bio_X509(bio.get(), nullptr, nullptr, nullptr));
  if (cert == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat(flag, " ", path, " holds no PEM certificate: ",
                     OpenSslError("no BEGIN CERTIFICATE block")));
  }
  return cert;
}

absl::Status CheckNotExpired(X509* cert, const std::string& path,
                             absl::string_view flag) {
  if (X509_cmp_current_time(X509_get0_notAfter(cert)) < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(flag, " ", path, ": the certificate has expired"));
  }
  if (X509_cmp_current_time(X509_get0_notBefore(cert)) > 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(flag, " ", path, ": the certificate is not valid yet"));
  }
  return absl::OkStatus();
}

// Every piece a node running `ends` needs, as one message naming each
// missing flag; OK when complete.
absl::Status CheckComplete(const TlsFiles& tls, GrpcEnds ends) {
  std::vector<std::string> missing;
  const bool serves = (ends & kGrpcServer) != 0;
  const bool connects = (ends & kGrpcClient) != 0;
  const bool need_cert = serves || (connects && tls.mutual) ||
                         !tls.cert_file.empty() || !tls.key_file.empty();
  const bool need_ca = connects || (serves && tls.mutual);
  if (need_ca && tls.ca_file.empty()) {
    missing.push_back(absl::StrCat(
        "--tls_ca_file (the CA that signed the cluster's certificates, to "
        "verify ",
        connects ? "the servers this node calls" : "client certificates", ")"));
  }
  if (need_cert && tls.cert_file.empty()) {
    missing.push_back(absl::StrCat(
        "--tls_cert_file (this node's certificate, ",
        serves ? "served by its gRPC service" : "presented under --tls_mutual",
        ")"));
  }
  if (need_cert && tls.key_file.empty()) {
    missing.push_back("--tls_key_file (the private key of --tls_cert_file)");
  }
  if (missing.empty()) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat("incomplete TLS configuration for a gRPC ",
                   serves && connects ? "server and client"
                   : serves           ? "server"
                                      : "client",
                   ": missing ", absl::StrJoin(missing, "; missing ")));
}

absl::StatusOr<TlsMaterial> LoadTls(const TlsFiles& tls, GrpcEnds ends) {
  DP_RETURN_IF_ERROR(CheckComplete(tls, ends));
  TlsMaterial m;
  m.mutual = tls.mutual;
  m.server_name = tls.server_name;
  if (!tls.ca_file.empty()) {
    DP_ASSIGN_OR_RETURN(m.ca_pem, ReadFile(tls.ca_file, "--tls_ca_file"));
    DP_ASSIGN_OR_RETURN(
        X509Ptr ca, FirstCertificate(m.ca_pem, tls.ca_file, "--tls_ca_file"));
    DP_RETURN_IF_ERROR(CheckNotExpired(ca.get(), tls.ca_file, "--tls_ca_file"));
  }
  if (!tls.cert_file.empty()) {
    DP_ASSIGN_OR_RETURN(m.cert_pem, ReadFile(tls.cert_file, "--tls_cert_file"));
    DP_ASSIGN_OR_RETURN(m.key_pem, ReadFile(tls.key_file, "--tls_key_file"));
    DP_ASSIGN_OR_RETURN(
        X509Ptr cert,
        FirstCertificate(m.cert_pem, tls.cert_file, "--tls_cert_file"));
    DP_RETURN_IF_ERROR(
        CheckNotExpired(cert.get(), tls.cert_file, "--tls_cert_file"));
    auto bio = MemBio(m.key_pem);
    std::unique_ptr<EVP_PKEY, PkeyFree> key(
        PEM_read_bio_PrivateKey(bio.get(), nullptr, nullptr, nullptr));
    if (key == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--tls_key_file ", tls.key_file, " holds no PEM private key: ",
          OpenSslError("no BEGIN PRIVATE KEY block")));
    }
    if (X509_check_private_key(cert.get(), key.get()) != 1) {
      ERR_clear_error();
      return absl::InvalidArgumentError(
          absl::StrCat("--tls_key_file ", tls.key_file,
                       " is not the key of --tls_cert_file ", tls.cert_file));
    }
  }
  return m;
}

}  // namespace

std::vector<std::string> TlsFiles::ToFlags() const {
  std::vector<std::string> flags;
  if (!ca_file.empty()) flags.push_back("--tls_ca_file=" + ca_file);
  if (!cert_file.empty()) flags.push_back("--tls_cert_file=" + cert_file);
  if (!key_file.empty()) flags.push_back("--tls_key_file=" + key_file);
  if (mutual) flags.push_back("--tls_mutual");
  if (!server_name.empty()) flags.push_back("--tls_server_name=" + server_name);
  return flags;
}

bool SecretsEqual(absl::string_view presented, absl::string_view expected) {
  return presented.size() == expected.size() &&
         CRYPTO_memcmp(presented.data(), expected.data(), expected.size()) == 0;
}

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
  DP_ASSIGN_OR_RETURN(auth.token_, DeriveToken(auth.secret_));
  return auth;
}

absl::StatusOr<ClusterAuth> ClusterAuth::FromFile(const std::string& path) {
  DP_ASSIGN_OR_RETURN(std::string text, ReadFile(path, "cluster secret file"));
  auto auth = FromSecret(absl::StripAsciiWhitespace(text));
  if (!auth.ok()) {
    return absl::Status(auth.status().code(),
                        absl::StrCat(path, ": ", auth.status().message()));
  }
  return auth;
}

absl::StatusOr<ClusterAuth> ClusterAuth::Load(const std::string& secret_file,
                                              const TlsFiles& tls,
                                              GrpcEnds ends) {
  ClusterAuth auth;
  if (!secret_file.empty()) {
    DP_ASSIGN_OR_RETURN(auth, FromFile(secret_file));
  }
  if (tls.enabled()) {
    DP_ASSIGN_OR_RETURN(auth.tls_, LoadTls(tls, ends));
    auth.tls_enabled_ = true;
  }
  return auth;
}

TlsFiles ClusterAuth::TlsFilesFromFlags() {
  TlsFiles tls;
  tls.ca_file = absl::GetFlag(FLAGS_tls_ca_file);
  tls.cert_file = absl::GetFlag(FLAGS_tls_cert_file);
  tls.key_file = absl::GetFlag(FLAGS_tls_key_file);
  tls.mutual = absl::GetFlag(FLAGS_tls_mutual);
  tls.server_name = absl::GetFlag(FLAGS_tls_server_name);
  return tls;
}

absl::StatusOr<ClusterAuth> ClusterAuth::FromFlags(GrpcEnds ends) {
  const std::string path = absl::GetFlag(FLAGS_cluster_secret_file);
  DP_ASSIGN_OR_RETURN(ClusterAuth auth, Load(path, TlsFilesFromFlags(), ends));
  if (auth.enabled()) {
    DP_LOG(INFO) << "cluster authentication on (" << path << ")";
  }
  if (auth.tls_enabled()) {
    DP_LOG(INFO) << "gRPC over TLS"
                 << (auth.tls().mutual ? " with client certificates" : "");
    if (!auth.enabled()) {
      DP_LOG(WARNING) << "TLS protects gRPC only: without "
                         "--cluster_secret_file the data plane is open";
    }
  }
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

absl::Status ClusterAuth::CheckToken(absl::string_view presented) const {
  if (!enabled()) return absl::OkStatus();
  if (presented.empty()) {
    return absl::UnauthenticatedError("carries no cluster token");
  }
  if (!SecretsEqual(presented, token_)) {
    return absl::UnauthenticatedError("carries a wrong cluster token");
  }
  return absl::OkStatus();
}

}  // namespace downpour
