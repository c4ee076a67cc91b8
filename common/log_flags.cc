#include "common/log_flags.h"

#include <cstdint>
#include <string>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "common/logging.h"

ABSL_FLAG(int32_t, minloglevel, 0,
          "drop log messages below this severity: 0 INFO, 1 WARNING, "
          "2 ERROR, 3 FATAL");
ABSL_FLAG(int32_t, v, 0,
          "verbose logging: also write detail messages up to this level");
ABSL_FLAG(std::string, log_format, "text",
          "text, or json: one JSON object per line (time, severity, tag, "
          "file, line, message) for log collectors");

namespace downpour {

absl::Status ApplyLogFlags() {
  const int32_t level = absl::GetFlag(FLAGS_minloglevel);
  if (level < static_cast<int32_t>(LogSeverity::kInfo) ||
      level > static_cast<int32_t>(LogSeverity::kFatal)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--minloglevel=", level,
                     " outside [0, 3] (0 INFO, 1 WARNING, 2 ERROR, 3 FATAL)"));
  }
  const int32_t verbosity = absl::GetFlag(FLAGS_v);
  if (verbosity < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--v=", verbosity, ": must be 0 or more"));
  }
  const std::string format = absl::GetFlag(FLAGS_log_format);
  LogFormat f;
  if (format == "text") {
    f = LogFormat::kText;
  } else if (format == "json") {
    f = LogFormat::kJson;
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat("--log_format=", format, ": text or json"));
  }
  SetMinLogSeverity(static_cast<LogSeverity>(level));
  SetLogVerbosity(verbosity);
  SetLogFormat(f);
  return absl::OkStatus();
}

}  // namespace downpour
