#include "common/auth.h"

#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/x509.h>

#include <cstdio>
#include <fstream>
#include <string>

#include "common/test_util.h"
#include "gtest/gtest.h"
#include "testing/test_certs.h"

namespace downpour {
namespace {

TEST(SecretsEqualTest, ExactBytesOnly) {
  EXPECT_TRUE(SecretsEqual("s3cret", "s3cret"));
  EXPECT_FALSE(SecretsEqual("s3cres", "s3cret"));
  EXPECT_FALSE(SecretsEqual("s3cre", "s3cret"));
  EXPECT_FALSE(SecretsEqual("s3crett", "s3cret"));
  EXPECT_FALSE(SecretsEqual("", "s3cret"));
  EXPECT_TRUE(SecretsEqual("", ""));
  // Bytes after a NUL count (no C-string comparison).
  EXPECT_FALSE(SecretsEqual(std::string("ab\0c", 4), std::string("ab\0d", 4)));
}

TEST(ClusterAuthTest, OffByDefault) {
  ClusterAuth auth;
  EXPECT_FALSE(auth.enabled());
  EXPECT_TRUE(auth.curve_secret_key().empty());
}

TEST(ClusterAuthTest, NewSecretGivesAKeyPair) {
  ASSERT_OK_AND_ASSIGN(std::string secret, ClusterAuth::NewSecret());
  ASSERT_OK_AND_ASSIGN(ClusterAuth auth, ClusterAuth::FromSecret(secret));
  EXPECT_TRUE(auth.enabled());
  EXPECT_EQ(auth.curve_secret_key(), secret);
  EXPECT_EQ(auth.curve_public_key().size(), 40u);
  EXPECT_NE(auth.curve_public_key(), secret);
  // Deterministic: every node derives the same public key.
  ASSERT_OK_AND_ASSIGN(ClusterAuth again, ClusterAuth::FromSecret(secret));
  EXPECT_EQ(again.curve_public_key(), auth.curve_public_key());
  // Two secrets, two public keys.
  ASSERT_OK_AND_ASSIGN(std::string other, ClusterAuth::NewSecret());
  ASSERT_OK_AND_ASSIGN(ClusterAuth auth2, ClusterAuth::FromSecret(other));
  EXPECT_NE(auth2.curve_public_key(), auth.curve_public_key());
}

TEST(ClusterAuthTest, RejectsMalformedSecrets) {
  EXPECT_THAT(ClusterAuth::FromSecret("short"),
              StatusIs(absl::StatusCode::kInvalidArgument));
  // 40 characters, but '"' and ' ' are not in the Z85 alphabet.
  EXPECT_THAT(ClusterAuth::FromSecret(std::string(39, 'a') + "\""),
              StatusIs(absl::StatusCode::kInvalidArgument));
}

TEST(ClusterAuthTest, ReadsFilesAndNamesThemInErrors) {
  const std::string dir = ::testing::TempDir();
  EXPECT_THAT(ClusterAuth::FromFile(dir + "/no-such-secret"),
              StatusIs(absl::StatusCode::kNotFound));
  ASSERT_OK_AND_ASSIGN(std::string secret, ClusterAuth::NewSecret());
  const std::string good = dir + "/good.secret";
  std::ofstream(good) << "  " << secret << "\n";
  ASSERT_OK_AND_ASSIGN(ClusterAuth auth, ClusterAuth::FromFile(good));
  EXPECT_EQ(auth.curve_secret_key(), secret);
  const std::string bad = dir + "/bad.secret";
  std::ofstream(bad) << "not a key\n";
  auto status = ClusterAuth::FromFile(bad).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find("bad.secret"), std::string::npos) << status;
}

// A known answer, computed independently:
//   printf 'downpour control plane token v1' | openssl dgst -sha256 -hmac KEY
TEST(ClusterAuthTest, TokenIsTheHmacOfALabelKeyedByTheSecret) {
  const std::string secret = "Hec.D8E].w?:Tu/T0Ca*pX9Iq>we?e5j-YPMe*Y^";
  ASSERT_OK_AND_ASSIGN(ClusterAuth auth, ClusterAuth::FromSecret(secret));
  EXPECT_EQ(auth.token(),
            "Downpour "
            "4be3f2d4ae89ce86deda24c3f8173bc35fef7210ba9435ffd22486e402570838");
  EXPECT_EQ(auth.token().find(secret), std::string::npos);
}

TEST(ClusterAuthTest, CheckTokenAcceptsOnlyTheToken) {
  EXPECT_OK(ClusterAuth().CheckToken(""));  // off: nothing is checked
  ASSERT_OK_AND_ASSIGN(std::string secret, ClusterAuth::NewSecret());
  ASSERT_OK_AND_ASSIGN(ClusterAuth auth, ClusterAuth::FromSecret(secret));
  EXPECT_OK(auth.CheckToken(auth.token()));
  auto missing = auth.CheckToken("");
  EXPECT_THAT(missing, StatusIs(absl::StatusCode::kUnauthenticated));
  EXPECT_THAT(std::string(missing.message()),
              ::testing::HasSubstr("no cluster token"));
  std::string flipped = auth.token();
  flipped.back() ^= 1;
  for (const std::string& wrong :
       {flipped, auth.token().substr(0, auth.token().size() - 1),
        auth.token() + "0", std::string("Downpour ")}) {
    auto s = auth.CheckToken(wrong);
    EXPECT_THAT(s, StatusIs(absl::StatusCode::kUnauthenticated)) << wrong;
    EXPECT_THAT(std::string(s.message()),
                ::testing::HasSubstr("wrong cluster token"));
  }
  ASSERT_OK_AND_ASSIGN(std::string other, ClusterAuth::NewSecret());
  ASSERT_OK_AND_ASSIGN(ClusterAuth auth2, ClusterAuth::FromSecret(other));
  EXPECT_THAT(auth.CheckToken(auth2.token()),
              StatusIs(absl::StatusCode::kUnauthenticated));
}

class TlsLoadTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new std::string(TestTmpDir() + "/tls_load");
    other_ = new std::string(TestTmpDir() + "/tls_load_other");
    ASSERT_OK(MakeTestCertificates(*dir_, {"node", "second"}));
    ASSERT_OK(MakeTestCertificates(*other_, {"node"}));
  }
  static void TearDownTestSuite() {
    delete dir_;
    delete other_;
  }
  static TlsFiles Node() { return TestCertificate(*dir_, "node"); }

  static std::string* dir_;
  static std::string* other_;
};
std::string* TlsLoadTest::dir_ = nullptr;
std::string* TlsLoadTest::other_ = nullptr;

TEST_F(TlsLoadTest, OffWithoutAnyTlsSetting) {
  ASSERT_OK_AND_ASSIGN(ClusterAuth auth,
                       ClusterAuth::Load("", TlsFiles(), kGrpcClientAndServer));
  EXPECT_FALSE(auth.tls_enabled());
  EXPECT_FALSE(auth.enabled());
  EXPECT_TRUE(TlsFiles().ToFlags().empty());
}

TEST_F(TlsLoadTest, ACompleteConfigurationLoadsItsFiles) {
  TlsFiles tls = Node();
  tls.mutual = true;
  tls.server_name = "localhost";
  ASSERT_OK_AND_ASSIGN(ClusterAuth auth,
                       ClusterAuth::Load("", tls, kGrpcClientAndServer));
  EXPECT_TRUE(auth.tls_enabled());
  EXPECT_FALSE(auth.enabled());  // no secret: no token, no CURVE
  EXPECT_THAT(auth.tls().ca_pem, ::testing::HasSubstr("BEGIN CERTIFICATE"));
  EXPECT_THAT(auth.tls().cert_pem, ::testing::HasSubstr("BEGIN CERTIFICATE"));
  EXPECT_THAT(auth.tls().key_pem, ::testing::HasSubstr("PRIVATE KEY"));
  EXPECT_TRUE(auth.tls().mutual);
  EXPECT_EQ(auth.tls().server_name, "localhost");
  EXPECT_EQ(tls.ToFlags(), (std::vector<std::string>{
                               "--tls_ca_file=" + tls.ca_file,
                               "--tls_cert_file=" + tls.cert_file,
                               "--tls_key_file=" + tls.key_file, "--tls_mutual",
                               "--tls_server_name=localhost"}));
  // A client needs only the CA; a server only its certificate and key.
  TlsFiles client;
  client.ca_file = tls.ca_file;
  EXPECT_OK(ClusterAuth::Load("", client, kGrpcClient));
  TlsFiles server = Node();
  server.ca_file.clear();
  EXPECT_OK(ClusterAuth::Load("", server, kGrpcServer));
}

// Half a configuration names every missing flag, for the ends the node runs.
TEST_F(TlsLoadTest, HalfAConfigurationNamesWhatIsMissing) {
  struct Case {
    TlsFiles tls;
    GrpcEnds ends;
    std::vector<std::string> missing;
    std::vector<std::string> not_missing;
  };
  const TlsFiles full = Node();
  auto with = [](TlsFiles t, auto edit) {
    edit(t);
    return t;
  };
  const std::vector<Case> cases = {
      // A client without the CA.
      {with(full, [](TlsFiles& t) { t.ca_file.clear(); }),
       kGrpcClient,
       {"--tls_ca_file"},
       {"--tls_cert_file", "--tls_key_file"}},
      // A server without its key, or its certificate.
      {with(full, [](TlsFiles& t) { t.key_file.clear(); }),
       kGrpcServer,
       {"--tls_key_file"},
       {"--tls_ca_file", "missing --tls_cert_file"}},
      {with(full, [](TlsFiles& t) { t.cert_file.clear(); }),
       kGrpcServer,
       {"--tls_cert_file"},
       {"--tls_ca_file"}},
      // A server given only the CA.
      {with(TlsFiles(), [&](TlsFiles& t) { t.ca_file = full.ca_file; }),
       kGrpcClientAndServer,
       {"--tls_cert_file", "--tls_key_file"},
       {}},
      // Mutual TLS: a client needs its certificate, a server the CA.
      {with(TlsFiles(),
            [&](TlsFiles& t) {
              t.ca_file = full.ca_file;
              t.mutual = true;
            }),
       kGrpcClient,
       {"--tls_cert_file", "--tls_key_file"},
       {}},
      {with(full,
            [](TlsFiles& t) {
              t.ca_file.clear();
              t.mutual = true;
            }),
       kGrpcServer,
       {"--tls_ca_file"},
       {}},
      // --tls_mutual or --tls_server_name alone.
      {with(TlsFiles(), [](TlsFiles& t) { t.mutual = true; }),
       kGrpcClientAndServer,
       {"--tls_ca_file", "--tls_cert_file", "--tls_key_file"},
       {}},
      {with(TlsFiles(), [](TlsFiles& t) { t.server_name = "x"; }),
       kGrpcClient,
       {"--tls_ca_file"},
       {}},
  };
  for (size_t i = 0; i < cases.size(); ++i) {
    const Case& c = cases[i];
    auto s = ClusterAuth::Load("", c.tls, c.ends).status();
    EXPECT_THAT(s, StatusIs(absl::StatusCode::kInvalidArgument))
        << "case " << i;
    EXPECT_THAT(std::string(s.message()),
                ::testing::HasSubstr("incomplete TLS configuration"))
        << "case " << i;
    for (const std::string& flag : c.missing) {
      EXPECT_THAT(std::string(s.message()),
                  ::testing::HasSubstr("missing " + flag))
          << "case " << i << ": " << s;
    }
    for (const std::string& flag : c.not_missing) {
      EXPECT_THAT(std::string(s.message()),
                  ::testing::Not(::testing::HasSubstr(flag)))
          << "case " << i << ": " << s;
    }
  }
}

TEST_F(TlsLoadTest, BadFilesAreNamed) {
  TlsFiles tls = Node();
  tls.ca_file = *dir_ + "/no-such-ca.pem";
  auto s = ClusterAuth::Load("", tls, kGrpcClient).status();
  EXPECT_THAT(s, StatusIs(absl::StatusCode::kNotFound));
  EXPECT_THAT(std::string(s.message()), ::testing::HasSubstr("no-such-ca.pem"));

  const std::string junk = *dir_ + "/junk.pem";
  std::ofstream(junk) << "not a certificate\n";
  tls = Node();
  tls.ca_file = junk;
  s = ClusterAuth::Load("", tls, kGrpcClient).status();
  EXPECT_THAT(s, StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(std::string(s.message()),
              ::testing::HasSubstr("--tls_ca_file " + junk));

  tls = Node();
  tls.cert_file = junk;
  s = ClusterAuth::Load("", tls, kGrpcServer).status();
  EXPECT_THAT(s, StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(std::string(s.message()),
              ::testing::HasSubstr("--tls_cert_file " + junk));

  tls = Node();
  tls.key_file = tls.cert_file;  // a certificate is not a key
  s = ClusterAuth::Load("", tls, kGrpcServer).status();
  EXPECT_THAT(s, StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(std::string(s.message()),
              ::testing::HasSubstr("no PEM private key"));

  // Another node's key.
  tls = Node();
  tls.key_file = TestCertificate(*dir_, "second").key_file;
  s = ClusterAuth::Load("", tls, kGrpcServer).status();
  EXPECT_THAT(s, StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(std::string(s.message()),
              ::testing::HasSubstr("is not the key of"));

  // The secret's errors still name its file.
  s = ClusterAuth::Load(*dir_ + "/no-secret", Node(), kGrpcServer).status();
  EXPECT_THAT(s, StatusIs(absl::StatusCode::kNotFound));
  EXPECT_THAT(std::string(s.message()), ::testing::HasSubstr("no-secret"));
}

// Writes a self-signed certificate valid from 2 days ago to 1 day ago, and
// its key.
void WriteExpiredCertificate(const std::string& cert_path,
                             const std::string& key_path) {
  EVP_PKEY* key = EVP_EC_gen("P-256");
  ASSERT_NE(key, nullptr);
  X509* cert = X509_new();
  X509_set_version(cert, 2);
  ASN1_INTEGER_set(X509_get_serialNumber(cert), 1);
  X509_gmtime_adj(X509_getm_notBefore(cert), -2 * 86400);
  X509_gmtime_adj(X509_getm_notAfter(cert), -86400);
  X509_NAME* name = X509_get_subject_name(cert);
  X509_NAME_add_entry_by_txt(name, "CN", MBSTRING_ASC,
                             reinterpret_cast<const unsigned char*>("expired"),
                             -1, -1, 0);
  X509_set_issuer_name(cert, name);
  X509_set_pubkey(cert, key);
  ASSERT_GT(X509_sign(cert, key, EVP_sha256()), 0);
  FILE* f = std::fopen(cert_path.c_str(), "w");
  ASSERT_NE(f, nullptr);
  PEM_write_X509(f, cert);
  std::fclose(f);
  f = std::fopen(key_path.c_str(), "w");
  ASSERT_NE(f, nullptr);
  PEM_write_PrivateKey(f, key, nullptr, nullptr, 0, nullptr, nullptr);
  std::fclose(f);
  X509_free(cert);
  EVP_PKEY_free(key);
}

TEST_F(TlsLoadTest, AnExpiredCertificateIsRefusedAtStart) {
  TlsFiles tls = Node();
  tls.cert_file = *dir_ + "/expired.pem";
  tls.key_file = *dir_ + "/expired.key";
  WriteExpiredCertificate(tls.cert_file, tls.key_file);
  auto s = ClusterAuth::Load("", tls, kGrpcServer).status();
  EXPECT_THAT(s, StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(std::string(s.message()), ::testing::HasSubstr("expired.pem"));
  EXPECT_THAT(std::string(s.message()), ::testing::HasSubstr("has expired"));
  // Also as the CA.
  tls = Node();
  tls.ca_file = *dir_ + "/expired.pem";
  s = ClusterAuth::Load("", tls, kGrpcClient).status();
  EXPECT_THAT(s, StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(std::string(s.message()), ::testing::HasSubstr("--tls_ca_file"));
}

}  // namespace
}  // namespace downpour
