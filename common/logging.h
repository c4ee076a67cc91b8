// A minimal logger: one line per message to stderr, with time, severity,
// file and line. Chosen over glog to keep the dependency list short and the
// output format under our control; thread-safe (each line is one write).
//
//   DP_LOG(INFO) << "serving table " << name;
//   DP_CHECK(ptr != nullptr) << "programmer error only";  // aborts
#ifndef DOWNPOUR_COMMON_LOGGING_H_
#define DOWNPOUR_COMMON_LOGGING_H_

#include <sstream>
#include <string>

namespace downpour {

enum class LogSeverity { kInfo = 0, kWarning = 1, kError = 2, kFatal = 3 };

// Messages below this severity are dropped (kFatal never is). Default
// kInfo; daemons set it from --minloglevel (common/log_flags.h).
void SetMinLogSeverity(LogSeverity severity);
// Prefix added to every line (e.g. "server 2"), so that logs of several
// daemons in one terminal stay readable.
void SetLogTag(const std::string& tag);

namespace internal {

class LogMessage {
 public:
  LogMessage(LogSeverity severity, const char* file, int line);
  ~LogMessage();  // writes the line; aborts for kFatal
  std::ostream& stream() { return stream_; }

 private:
  LogSeverity severity_;
  std::ostringstream stream_;
};

// Swallows the stream when the condition holds (for DP_CHECK).
struct LogVoidify {
  void operator&(std::ostream&) {}
};

}  // namespace internal
}  // namespace downpour

#define DP_LOG_SEVERITY_INFO ::downpour::LogSeverity::kInfo
#define DP_LOG_SEVERITY_WARNING ::downpour::LogSeverity::kWarning
#define DP_LOG_SEVERITY_ERROR ::downpour::LogSeverity::kError
#define DP_LOG_SEVERITY_FATAL ::downpour::LogSeverity::kFatal

#define DP_LOG(severity)                                               \
  ::downpour::internal::LogMessage(DP_LOG_SEVERITY_##severity, __FILE__, \
                                   __LINE__)                           \
      .stream()

// For programmer errors only: a bad request or a bad peer must never reach a
// DP_CHECK.
#define DP_CHECK(condition)                                      \
  (condition) ? (void)0                                          \
              : ::downpour::internal::LogVoidify() &             \
                    DP_LOG(FATAL) << "Check failed: " #condition " "

#endif  // DOWNPOUR_COMMON_LOGGING_H_
