#include "testing/test_certs.h"

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "common/subprocess.h"
#include "common/test_util.h"

namespace downpour {

absl::StatusOr<TlsFiles> MakeTestCertificates(
    const std::string& dir, const std::vector<std::string>& names) {
  std::vector<std::string> argv = {
      "/bin/bash", RunfilePath("tools/make_test_certs.sh"), dir};
  argv.insert(argv.end(), names.begin(), names.end());
  Subprocess script(argv, dir + ".log");
  DP_RETURN_IF_ERROR(script.Start());
  DP_ASSIGN_OR_RETURN(int status, script.Wait(absl::Seconds(60)),
                      "tools/make_test_certs.sh");
  if (status != 0) {
    return absl::InternalError(absl::StrCat("tools/make_test_certs.sh ", dir,
                                            " failed (wait status ", status,
                                            "):\n", script.LogTail()));
  }
  return TestCertificate(dir, names.empty() ? "node" : names[0]);
}

TlsFiles TestCertificate(const std::string& dir, const std::string& name) {
  TlsFiles tls;
  tls.ca_file = dir + "/ca.pem";
  tls.cert_file = absl::StrCat(dir, "/", name, ".pem");
  tls.key_file = absl::StrCat(dir, "/", name, ".key");
  return tls;
}

}  // namespace downpour
