// Test helpers: status assertions and real daemon processes.
//
//   ASSERT_OK(status_or_statusor);
//   ASSERT_OK_AND_ASSIGN(Table t, client->CreateTable(options));
//   EXPECT_THAT(status, StatusIs(absl::StatusCode::kOutOfRange));
//   std::string bin = RunfilePath("server/ps_server");
#ifndef DOWNPOUR_COMMON_TEST_UTIL_H_
#define DOWNPOUR_COMMON_TEST_UTIL_H_

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/types.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/subprocess.h"

namespace downpour {
namespace testing_internal {

inline const absl::Status& GetStatus(const absl::Status& s) { return s; }
template <typename T>
const absl::Status& GetStatus(const absl::StatusOr<T>& s) {
  return s.status();
}

template <typename T>
::testing::AssertionResult IsOk(const T& value) {
  const absl::Status& s = GetStatus(value);
  if (s.ok()) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << s;
}

}  // namespace testing_internal

// Each evaluates `expr` once.
#define EXPECT_OK(expr) EXPECT_TRUE(::downpour::testing_internal::IsOk(expr))
#define ASSERT_OK(expr) ASSERT_TRUE(::downpour::testing_internal::IsOk(expr))

// ASSERT_OK_AND_ASSIGN(Foo foo, MakeFoo()): asserts the StatusOr is OK and
// moves its value into the declaration.
#define DP_TEST_CONCAT_INNER(a, b) a##b
#define DP_TEST_CONCAT(a, b) DP_TEST_CONCAT_INNER(a, b)
#define ASSERT_OK_AND_ASSIGN(lhs, expr) \
  ASSERT_OK_AND_ASSIGN_IMPL(DP_TEST_CONCAT(statusor_, __LINE__), lhs, expr)
#define ASSERT_OK_AND_ASSIGN_IMPL(tmp, lhs, expr) \
  auto tmp = (expr);                              \
  ASSERT_OK(tmp);                                 \
  lhs = std::move(tmp).value()

// Matches an absl::Status or absl::StatusOr<T> with the given code.
MATCHER_P(StatusIs, code,
          std::string(negation ? "does not have" : "has") + " code " +
              absl::StatusCodeToString(code)) {
  const absl::Status& s = ::downpour::testing_internal::GetStatus(arg);
  *result_listener << "status is " << s;
  return s.code() == code;
}

// The seed of a randomized test: `fixed` by default, so that every run
// repeats; the environment variable DOWNPOUR_TEST_SEED may name another
// (a number) or ask for a fresh one ("random"), e.g.
//   bazel test //tests:cluster_test --test_env=DOWNPOUR_TEST_SEED=random
// The seed is printed with the way to repeat it; a malformed variable
// fails the test.
uint32_t TestSeed(uint32_t fixed);

// Where the test may write: $TEST_TMPDIR, else /tmp.
std::string TestTmpDir();

// Where a test leaves files for people to read after it ran (Bazel zips
// TEST_UNDECLARED_OUTPUTS_DIR into the test's outputs): e.g. the logs of
// the processes a failed run started. TestTmpDir() when unset.
std::string TestOutputDir();

// Path of a file built into the test's runfiles, e.g. "server/ps_server".
std::string RunfilePath(const std::string& relative);

// Polls until `path` exists and is non-empty, then returns its content with
// trailing white space removed. kDeadlineExceeded after `timeout`.
absl::StatusOr<std::string> WaitForFile(const std::string& path,
                                        absl::Duration timeout);

}  // namespace downpour

#endif  // DOWNPOUR_COMMON_TEST_UTIL_H_
