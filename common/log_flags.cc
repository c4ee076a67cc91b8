#include "common/log_flags.h"

#include <cstdint>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "common/logging.h"

ABSL_FLAG(int32_t, minloglevel, 0,
          "drop log messages below this severity: 0 INFO, 1 WARNING, "
          "2 ERROR, 3 FATAL");

namespace downpour {

absl::Status ApplyLogFlags() {
  const int32_t level = absl::GetFlag(FLAGS_minloglevel);
  if (level < static_cast<int32_t>(LogSeverity::kInfo) ||
      level > static_cast<int32_t>(LogSeverity::kFatal)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--minloglevel=", level,
                     " outside [0, 3] (0 INFO, 1 WARNING, 2 ERROR, 3 FATAL)"));
  }
  SetMinLogSeverity(static_cast<LogSeverity>(level));
  return absl::OkStatus();
}

}  // namespace downpour
