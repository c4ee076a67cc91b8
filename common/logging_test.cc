#include "common/logging.h"

#include <fcntl.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>

#include "absl/flags/declare.h"
#include "absl/flags/flag.h"
#include "absl/time/time.h"
#include "common/log_flags.h"
#include "gtest/gtest.h"

ABSL_DECLARE_FLAG(int32_t, minloglevel);
ABSL_DECLARE_FLAG(int32_t, v);
ABSL_DECLARE_FLAG(std::string, log_format);

namespace downpour {
namespace {

// Sends stderr to a file while alive; Read() returns what was written.
class CaptureStderr {
 public:
  CaptureStderr() {
    const char* dir = std::getenv("TEST_TMPDIR");
    path_ = std::string(dir != nullptr ? dir : "/tmp") + "/stderr.txt";
    saved_ = ::dup(STDERR_FILENO);
    const int fd = ::open(path_.c_str(), O_CREAT | O_TRUNC | O_WRONLY, 0600);
    ::dup2(fd, STDERR_FILENO);
    ::close(fd);
  }
  ~CaptureStderr() { Restore(); }
  std::string Read() {
    Restore();
    std::ifstream in(path_);
    std::stringstream s;
    s << in.rdbuf();
    return s.str();
  }

 private:
  void Restore() {
    if (saved_ < 0) return;
    ::dup2(saved_, STDERR_FILENO);
    ::close(saved_);
    saved_ = -1;
  }
  std::string path_;
  int saved_ = -1;
};

// Restores the defaults after each test.
class LoggingTest : public ::testing::Test {
 protected:
  void TearDown() override {
    absl::SetFlag(&FLAGS_minloglevel, 0);
    absl::SetFlag(&FLAGS_v, 0);
    absl::SetFlag(&FLAGS_log_format, "text");
    ASSERT_TRUE(ApplyLogFlags().ok());
    SetLogTag("");
  }
};

constexpr int64_t kMicros = 1700000000123456;  // 2023-11-14T22:13:20.123Z

TEST_F(LoggingTest, JsonLineEscapesAndCarriesEveryField) {
  const std::string line =
      internal::FormatLogLine(LogFormat::kJson, LogSeverity::kWarning, kMicros,
                              "server 2", "server/internal/dispatcher.cc", 42,
                              "table \"emb\"\tkeys\n[1, 2) \\ \x01");
  EXPECT_EQ(line,
            "{\"time\":\"2023-11-14T22:13:20.123Z\",\"severity\":\"WARNING\","
            "\"tag\":\"server 2\",\"file\":\"dispatcher.cc\",\"line\":42,"
            "\"message\":\"table \\\"emb\\\"\\tkeys\\n[1, 2) \\\\ "
            "\\u0001\"}");
}

TEST_F(LoggingTest, JsonLineWithoutTagLeavesTheFieldOut) {
  const std::string line = internal::FormatLogLine(
      LogFormat::kJson, LogSeverity::kInfo, kMicros, "", "a.cc", 7, "hi");
  EXPECT_EQ(line,
            "{\"time\":\"2023-11-14T22:13:20.123Z\",\"severity\":\"INFO\","
            "\"file\":\"a.cc\",\"line\":7,\"message\":\"hi\"}");
}

TEST_F(LoggingTest, TextLineHasSeverityLetterTagFileAndLine) {
  const std::string line =
      internal::FormatLogLine(LogFormat::kText, LogSeverity::kError, kMicros,
                              "scheduler", "scheduler/scheduler.cc", 9, "boom");
  ASSERT_EQ(line.substr(0, 1), "E");
  EXPECT_NE(line.find(" [scheduler] scheduler.cc:9] boom"), std::string::npos)
      << line;
}

TEST_F(LoggingTest, FlagsChooseFormatSeverityAndVerbosity) {
  absl::SetFlag(&FLAGS_log_format, "json");
  absl::SetFlag(&FLAGS_minloglevel, 1);
  absl::SetFlag(&FLAGS_v, 2);
  ASSERT_TRUE(ApplyLogFlags().ok());
  SetLogTag("worker 3");
  int formatted = 0;
  auto count = [&formatted] { return ++formatted; };
  CaptureStderr capture;
  DP_LOG(INFO) << "dropped below WARNING";
  DP_LOG(WARNING) << "kept " << 1;
  DP_VLOG(2) << "verbose " << count();  // formatted, then dropped (INFO)
  DP_VLOG(3) << "too verbose " << count();
  const std::string out = capture.Read();
  // DP_VLOG(3) was not even formatted; DP_VLOG(2) was, but it is an INFO
  // message and --minloglevel=1 drops it.
  EXPECT_EQ(formatted, 1);
  EXPECT_EQ(out.find("dropped"), std::string::npos) << out;
  EXPECT_EQ(out.find("verbose"), std::string::npos) << out;
  ASSERT_NE(out.find("\"severity\":\"WARNING\",\"tag\":\"worker 3\""),
            std::string::npos)
      << out;
  EXPECT_NE(out.find("\"message\":\"kept 1\"}\n"), std::string::npos) << out;
}

TEST_F(LoggingTest, VerbosityWritesVlogAtInfo) {
  absl::SetFlag(&FLAGS_v, 1);
  ASSERT_TRUE(ApplyLogFlags().ok());
  CaptureStderr capture;
  DP_VLOG(1) << "detail";
  DP_VLOG(2) << "more detail";
  const std::string out = capture.Read();
  EXPECT_NE(out.find("] detail\n"), std::string::npos) << out;
  EXPECT_EQ(out.find("more detail"), std::string::npos) << out;
}

TEST_F(LoggingTest, BadFlagValuesAreRejectedAndChangeNothing) {
  absl::SetFlag(&FLAGS_minloglevel, 4);
  absl::Status s = ApplyLogFlags();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("--minloglevel=4"), absl::string_view::npos) << s;
  absl::SetFlag(&FLAGS_minloglevel, 0);

  absl::SetFlag(&FLAGS_v, -1);
  s = ApplyLogFlags();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("--v=-1"), absl::string_view::npos) << s;
  absl::SetFlag(&FLAGS_v, 0);

  absl::SetFlag(&FLAGS_log_format, "xml");
  s = ApplyLogFlags();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("--log_format=xml"), absl::string_view::npos) << s;
  // The text format is still in force.
  CaptureStderr capture;
  DP_LOG(INFO) << "still text";
  const std::string out = capture.Read();
  EXPECT_EQ(out.find('{'), std::string::npos) << out;
  EXPECT_NE(out.find("] still text"), std::string::npos) << out;
}

}  // namespace
}  // namespace downpour
