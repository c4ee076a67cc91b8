#include "common/test_util.h"

#include <cstdio>
#include <cstdlib>
#include <random>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/address_file.h"

namespace downpour {

uint32_t TestSeed(uint32_t fixed) {
  const char* env = std::getenv("DOWNPOUR_TEST_SEED");
  uint32_t seed = fixed;
  if (env != nullptr && *env != '\0') {
    if (std::string(env) == "random") {
      seed = std::random_device()();
    } else if (!absl::SimpleAtoi(env, &seed)) {
      ADD_FAILURE() << "DOWNPOUR_TEST_SEED='" << env
                    << "' is neither a number nor 'random'; using " << fixed;
      seed = fixed;
    }
  }
  std::printf("test seed %u (repeat with DOWNPOUR_TEST_SEED=%u)\n", seed, seed);
  std::fflush(stdout);
  return seed;
}

std::string TestTmpDir() {
  const char* dir = std::getenv("TEST_TMPDIR");
  return dir != nullptr ? dir : "/tmp";
}

std::string TestOutputDir() {
  const char* dir = std::getenv("TEST_UNDECLARED_OUTPUTS_DIR");
  return dir != nullptr ? dir : TestTmpDir();
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
