// Test helpers: status assertions and real daemon processes.
//
//   ASSERT_OK(status_or_statusor);
//   EXPECT_THAT(status, StatusIs(absl::StatusCode::kOutOfRange));
//   Subprocess server({RunfilePath("server/ps_server"), "--port=0"}, "server.log");
#ifndef DOWNPOUR_COMMON_TEST_UTIL_H_
#define DOWNPOUR_COMMON_TEST_UTIL_H_

#include <sys/types.h>

#include <optional>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace downpour {
namespace testing_internal {

inline const absl::Status& GetStatus(const absl::Status& s) { return s; }
template <typename T>
const absl::Status& GetStatus(const absl::StatusOr<T>& s) {
  return s.status();
}

}  // namespace testing_internal

#define EXPECT_OK(expr) \
  EXPECT_TRUE(::downpour::testing_internal::GetStatus(expr).ok()) \
      << ::downpour::testing_internal::GetStatus(expr)
#define ASSERT_OK(expr) \
  ASSERT_TRUE(::downpour::testing_internal::GetStatus(expr).ok()) \
      << ::downpour::testing_internal::GetStatus(expr)

// Matches an absl::Status or absl::StatusOr<T> with the given code.
MATCHER_P(StatusIs, code,
          std::string(negation ? "does not have" : "has") + " code " +
              absl::StatusCodeToString(code)) {
  const absl::Status& s = ::downpour::testing_internal::GetStatus(arg);
  *result_listener << "status is " << s;
  return s.code() == code;
}

// Where the test may write: $TEST_TMPDIR, else /tmp.
std::string TestTmpDir();

// Path of a file built into the test's runfiles, e.g. "server/ps_server".
std::string RunfilePath(const std::string& relative);

// Polls until `path` exists and is non-empty, then returns its content with
// trailing white space removed. kDeadlineExceeded after `timeout`.
absl::StatusOr<std::string> WaitForFile(const std::string& path,
                                        absl::Duration timeout);

// A child process (a real daemon) started with execv. Its stdout and stderr
// go to `log_path`. The destructor kills it (SIGKILL) if still running.
// Not thread-safe.
class Subprocess {
 public:
  Subprocess(std::vector<std::string> argv, std::string log_path);
  ~Subprocess();
  Subprocess(const Subprocess&) = delete;
  Subprocess& operator=(const Subprocess&) = delete;

  absl::Status Start();
  pid_t pid() const { return pid_; }
  void Signal(int signo);
  // Waits for exit; returns the raw wait status, or kDeadlineExceeded.
  absl::StatusOr<int> Wait(absl::Duration timeout);
  // Returns the last lines of the log, for failure messages.
  std::string LogTail(int max_bytes = 4000) const;

 private:
  std::vector<std::string> argv_;
  std::string log_path_;
  pid_t pid_ = -1;
  bool exited_ = false;
};

}  // namespace downpour

#endif  // DOWNPOUR_COMMON_TEST_UTIL_H_
