// Test certificates for gRPC TLS, made by tools/make_test_certs.sh (which
// the test must have as data: "//tools:make_test_certs.sh").
//
//   ASSERT_OK_AND_ASSIGN(TlsFiles tls,
//                        MakeTestCertificates(TestTmpDir() + "/pki", "node"));
//   tls.mutual = true;
#ifndef DOWNPOUR_TESTING_TEST_CERTS_H_
#define DOWNPOUR_TESTING_TEST_CERTS_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/auth.h"

namespace downpour {

// Makes (or reuses) the CA in `dir` and a certificate for each of `names`
// (valid for localhost and 127.0.0.1); returns the TlsFiles of the first
// name (ca_file, cert_file, key_file; not mutual). kInternal with the
// script's output if it fails (e.g. openssl missing).
absl::StatusOr<TlsFiles> MakeTestCertificates(
    const std::string& dir, const std::vector<std::string>& names);

// The TlsFiles of a certificate made earlier in `dir` for `name`.
TlsFiles TestCertificate(const std::string& dir, const std::string& name);

}  // namespace downpour

#endif  // DOWNPOUR_TESTING_TEST_CERTS_H_
