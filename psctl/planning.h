// `psctl calibrate` and `psctl plan` (issue 25): measure what the
// performance model needs on a cluster, then predict a job's throughput
// over a grid of workers, servers and modes before running it
// (planner/perf_model.h; docs/OPERATIONS.md, "Sizing a job").
//
//   psctl calibrate --model=mlp.json --calibration=cal.json   # local cluster
//   psctl calibrate --scheduler=HOST:PORT --calibration=cal.json  # live one
//   psctl plan --model=mlp.json --calibration=cal.json --workers=1..8
//       --servers=1..4 [--modes=bsp,ssp,asp] [-o json] [--plot=plan.png]
//
// Both return psctl's exit status: 0 done, 1 failed (a probe, a file that
// is missing, malformed or from another cluster: the message names the file
// and the field), 2 bad usage. Call from main() only, once flags are
// parsed.
#ifndef DOWNPOUR_PSCTL_PLANNING_H_
#define DOWNPOUR_PSCTL_PLANNING_H_

#include "common/auth.h"

namespace downpour {

// psctl's --workers and --servers are single numbers for `local` and `job`;
// `plan` takes them as ranges (1..8, 1,2,4). When argv's command is `plan`,
// this takes those two flags out of argv (keeping their text for
// PlanCommand) so that the flag parser does not refuse them. Call before
// absl::ParseCommandLine; a no-op for every other command.
void TakePlanRanges(int* argc, char** argv);

// `json`: the table as JSON (-o json).
int PlanCommand(bool json);
int CalibrateCommand(const ClusterAuth& auth);

}  // namespace downpour

#endif  // DOWNPOUR_PSCTL_PLANNING_H_
