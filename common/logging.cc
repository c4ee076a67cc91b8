#include "common/logging.h"

#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/json_text.h"

namespace downpour {
namespace {

std::atomic<int> g_min_severity{0};
std::atomic<int> g_format{static_cast<int>(LogFormat::kText)};
absl::Mutex g_tag_mu;
std::string* g_tag ABSL_GUARDED_BY(g_tag_mu) = nullptr;

const char* SeverityName(LogSeverity s) {
  switch (s) {
    case LogSeverity::kInfo:
      return "INFO";
    case LogSeverity::kWarning:
      return "WARNING";
    case LogSeverity::kError:
      return "ERROR";
    case LogSeverity::kFatal:
      return "FATAL";
  }
  return "?";
}

}  // namespace

void SetMinLogSeverity(LogSeverity severity) {
  g_min_severity.store(static_cast<int>(severity));
}

void SetLogVerbosity(int verbosity) {
  internal::g_log_verbosity.store(verbosity, std::memory_order_relaxed);
}

void SetLogFormat(LogFormat format) {
  g_format.store(static_cast<int>(format));
}

void SetLogTag(const std::string& tag) {
  absl::MutexLock lock(&g_tag_mu);
  delete g_tag;
  g_tag = new std::string(tag);
}

namespace internal {

std::atomic<int> g_log_verbosity{0};

std::string FormatLogLine(LogFormat format, LogSeverity severity,
                          int64_t unix_micros, const std::string& tag,
                          const char* file, int line,
                          const std::string& message) {
  const char* base = std::strrchr(file, '/');
  base = base != nullptr ? base + 1 : file;
  const absl::Time time = absl::FromUnixMicros(unix_micros);
  std::string out;
  if (format == LogFormat::kJson) {
    out = absl::StrCat(
        "{\"time\":\"",
        absl::FormatTime("%Y-%m-%dT%H:%M:%E3SZ", time, absl::UTCTimeZone()),
        "\",\"severity\":\"", SeverityName(severity), "\"");
    if (!tag.empty()) {
      out.append(",\"tag\":");
      AppendJsonString(tag, &out);
    }
    out.append(",\"file\":");
    AppendJsonString(base, &out);
    absl::StrAppend(&out, ",\"line\":", line, ",\"message\":");
    AppendJsonString(message, &out);
    out.push_back('}');
    return out;
  }
  out = absl::StrCat(
      std::string(1, SeverityName(severity)[0]),
      absl::FormatTime("%m%d %H:%M:%E3S ", time, absl::LocalTimeZone()));
  if (!tag.empty()) absl::StrAppend(&out, "[", tag, "] ");
  absl::StrAppend(&out, base, ":", line, "] ", message);
  return out;
}

LogMessage::LogMessage(LogSeverity severity, const char* file, int line)
    : severity_(severity), file_(file), line_(line) {}

LogMessage::~LogMessage() {
  if (static_cast<int>(severity_) >= g_min_severity.load() ||
      severity_ == LogSeverity::kFatal) {
    std::string tag;
    {
      absl::MutexLock lock(&g_tag_mu);
      if (g_tag != nullptr) tag = *g_tag;
    }
    std::string line = FormatLogLine(static_cast<LogFormat>(g_format.load()),
                                     severity_, absl::ToUnixMicros(absl::Now()),
                                     tag, file_, line_, stream_.str());
    line.push_back('\n');
    // One write() per line keeps lines from different threads whole.
    ssize_t unused = ::write(STDERR_FILENO, line.data(), line.size());
    (void)unused;
  }
  if (severity_ == LogSeverity::kFatal) std::abort();
}

}  // namespace internal
}  // namespace downpour
