#include "common/logging.h"

#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace downpour {
namespace {

std::atomic<int> g_min_severity{0};
absl::Mutex g_tag_mu;
std::string* g_tag ABSL_GUARDED_BY(g_tag_mu) = nullptr;

const char* SeverityLetter(LogSeverity s) {
  switch (s) {
    case LogSeverity::kInfo:
      return "I";
    case LogSeverity::kWarning:
      return "W";
    case LogSeverity::kError:
      return "E";
    case LogSeverity::kFatal:
      return "F";
  }
  return "?";
}

}  // namespace

void SetMinLogSeverity(LogSeverity severity) {
  g_min_severity.store(static_cast<int>(severity));
}

void SetLogTag(const std::string& tag) {
  absl::MutexLock lock(&g_tag_mu);
  delete g_tag;
  g_tag = new std::string(tag);
}

namespace internal {

LogMessage::LogMessage(LogSeverity severity, const char* file, int line)
    : severity_(severity) {
  const char* base = std::strrchr(file, '/');
  stream_ << SeverityLetter(severity)
          << absl::FormatTime("%m%d %H:%M:%E3S ", absl::Now(),
                              absl::LocalTimeZone());
  {
    absl::MutexLock lock(&g_tag_mu);
    if (g_tag != nullptr && !g_tag->empty()) stream_ << "[" << *g_tag << "] ";
  }
  stream_ << (base ? base + 1 : file) << ":" << line << "] ";
}

LogMessage::~LogMessage() {
  if (static_cast<int>(severity_) >= g_min_severity.load() ||
      severity_ == LogSeverity::kFatal) {
    stream_ << '\n';
    const std::string line = stream_.str();
    // One write() per line keeps lines from different threads whole.
    ssize_t unused = ::write(STDERR_FILENO, line.data(), line.size());
    (void)unused;
  }
  if (severity_ == LogSeverity::kFatal) std::abort();
}

}  // namespace internal
}  // namespace downpour
