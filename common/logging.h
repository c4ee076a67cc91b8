// A minimal logger: one line per message to stderr, with time, severity,
// file and line, as text or (for log collectors) as one JSON object per
// line. Chosen over glog to keep the dependency list short and the output
// format under our control; thread-safe (each line is one write).
//
//   DP_LOG(INFO) << "serving table " << name;
//   DP_VLOG(1) << "detail shown with --v=1 or more";
//   DP_CHECK(ptr != nullptr) << "programmer error only";  // aborts
//
// Daemons set the severity, verbosity and format from their flags
// (common/log_flags.h); libraries only log.
#ifndef DOWNPOUR_COMMON_LOGGING_H_
#define DOWNPOUR_COMMON_LOGGING_H_

#include <atomic>
#include <sstream>
#include <string>

namespace downpour {

enum class LogSeverity { kInfo = 0, kWarning = 1, kError = 2, kFatal = 3 };

enum class LogFormat {
  // I0102 15:04:05.123 [server 2] server.cc:42] message
  kText,
  // {"time":"2024-01-02T15:04:05.123Z","severity":"INFO","tag":"server 2",
  //  "file":"server.cc","line":42,"message":"message"}  (one line, UTC)
  kJson,
};

// Messages below this severity are dropped (kFatal never is). Default
// kInfo; daemons set it from --minloglevel (common/log_flags.h).
void SetMinLogSeverity(LogSeverity severity);
// DP_VLOG(n) messages are written when n <= verbosity. Default 0.
void SetLogVerbosity(int verbosity);
void SetLogFormat(LogFormat format);
// Prefix added to every line (e.g. "server 2"), so that logs of several
// daemons in one terminal stay readable.
void SetLogTag(const std::string& tag);

namespace internal {

extern std::atomic<int> g_log_verbosity;

class LogMessage {
 public:
  LogMessage(LogSeverity severity, const char* file, int line);
  ~LogMessage();  // writes the line; aborts for kFatal
  std::ostream& stream() { return stream_; }

 private:
  const LogSeverity severity_;
  const char* const file_;
  const int line_;
  std::ostringstream stream_;
};

// Swallows the stream when the condition holds (for DP_CHECK, DP_VLOG).
struct LogVoidify {
  void operator&(std::ostream&) {}
};

// The text and JSON forms of one line (without the newline), exposed for
// tests. `tag` may be empty; `unix_micros` is the time.
std::string FormatLogLine(LogFormat format, LogSeverity severity,
                          int64_t unix_micros, const std::string& tag,
                          const char* file, int line,
                          const std::string& message);

}  // namespace internal

// Whether DP_VLOG(level) writes; one relaxed load.
inline bool VlogIsOn(int level) {
  return level <= internal::g_log_verbosity.load(std::memory_order_relaxed);
}

}  // namespace downpour

#define DP_LOG_SEVERITY_INFO ::downpour::LogSeverity::kInfo
#define DP_LOG_SEVERITY_WARNING ::downpour::LogSeverity::kWarning
#define DP_LOG_SEVERITY_ERROR ::downpour::LogSeverity::kError
#define DP_LOG_SEVERITY_FATAL ::downpour::LogSeverity::kFatal

#define DP_LOG(severity)                                                 \
  ::downpour::internal::LogMessage(DP_LOG_SEVERITY_##severity, __FILE__, \
                                   __LINE__)                             \
      .stream()

// An INFO message written only with --v >= level; the message is not even
// formatted otherwise.
#define DP_VLOG(level)           \
  !(::downpour::VlogIsOn(level)) \
      ? (void)0                  \
      : ::downpour::internal::LogVoidify() & DP_LOG(INFO)

// For programmer errors only: a bad request or a bad peer must never reach a
// DP_CHECK.
#define DP_CHECK(condition)                          \
  (condition) ? (void)0                              \
              : ::downpour::internal::LogVoidify() & \
                    DP_LOG(FATAL) << "Check failed: " #condition " "

#endif  // DOWNPOUR_COMMON_LOGGING_H_
