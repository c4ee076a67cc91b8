// The logging flag every daemon shares (ps_scheduler, ps_server, ps_worker,
// ps_lbfgs):
//
//   --minloglevel=N   drop messages below severity N: 0 INFO (default),
//                     1 WARNING, 2 ERROR, 3 FATAL (FATAL is always written)
//
// A daemon's main() calls ApplyLogFlags() right after
// absl::ParseCommandLine; libraries never read the flag.
#ifndef DOWNPOUR_COMMON_LOG_FLAGS_H_
#define DOWNPOUR_COMMON_LOG_FLAGS_H_

#include "absl/status/status.h"

namespace downpour {

// Sets the logger's minimum severity (SetMinLogSeverity) from
// --minloglevel. kInvalidArgument, naming the flag and the range, for a
// value outside [0, 3]; the severity is then left as it was.
absl::Status ApplyLogFlags();

}  // namespace downpour

#endif  // DOWNPOUR_COMMON_LOG_FLAGS_H_
