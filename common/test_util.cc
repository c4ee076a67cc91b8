#include "common/test_util.h"

#include <cstdlib>

#include "absl/strings/str_cat.h"
#include "common/address_file.h"

namespace downpour {

std::string TestTmpDir() {
  const char* dir = std::getenv("TEST_TMPDIR");
  return dir != nullptr ? dir : "/tmp";
}

std::string RunfilePath(const std::string& relative) {
  const char* srcdir = std::getenv("TEST_SRCDIR");
  const char* workspace = std::getenv("TEST_WORKSPACE");
  if (srcdir != nullptr) {
    return absl::StrCat(srcdir, "/", workspace ? workspace : "downpour", "/",
                        relative);
  }
  return relative;  // run by hand from the workspace's bazel-bin
}

absl::StatusOr<std::string> WaitForFile(const std::string& path,
                                        absl::Duration timeout) {
  return WaitForAddressFile(path, timeout);
}

}  // namespace downpour
