// The logging flags every daemon shares (ps_scheduler, ps_server, ps_worker,
// ps_lbfgs, psctl):
//
//   --minloglevel=N     drop messages below severity N: 0 INFO (default),
//                       1 WARNING, 2 ERROR, 3 FATAL (FATAL is always written)
//   --v=N               also write DP_VLOG(n) messages with n <= N (default 0)
//   --log_format=F      text (default) or json: one JSON object per line,
//                       for log collectors (common/logging.h shows both)
//
// A daemon's main() calls ApplyLogFlags() right after
// absl::ParseCommandLine; libraries never read the flags.
#ifndef DOWNPOUR_COMMON_LOG_FLAGS_H_
#define DOWNPOUR_COMMON_LOG_FLAGS_H_

#include "absl/status/status.h"

namespace downpour {

// Sets the logger's minimum severity, verbosity and format from the flags.
// kInvalidArgument, naming the flag and what it accepts, for a
// --minloglevel outside [0, 3], a negative --v or an unknown --log_format;
// nothing is changed then.
absl::Status ApplyLogFlags();

}  // namespace downpour

#endif  // DOWNPOUR_COMMON_LOG_FLAGS_H_
