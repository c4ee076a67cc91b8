// The worker side of Sandblaster L-BFGS (ps_worker --job=lbfgs): asks the
// coordinator (lbfgs/coordinator.h) for gradient tasks as long as the job
// runs. For each task: pull x (once per round; sparse problems pull only the
// task's keys), compute the range's loss and gradient with the same task
// code as the reference run (lbfgs/problem.h), add the gradient into the
// table's gradient vector exactly once (Client::AddOnce with the task's
// round and id, so a backup copy or a rerun is never counted twice), then
// report the loss.
#ifndef DOWNPOUR_WORKER_SANDBLASTER_WORKER_H_
#define DOWNPOUR_WORKER_SANDBLASTER_WORKER_H_

#include <string>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "common/auth.h"

namespace downpour {

struct SandblasterWorkerOptions {
  std::string scheduler_address;
  ClusterAuth auth;  // the cluster secret, if it has one (common/auth.h)
  std::string coordinator_address;
  std::string name;  // in the coordinator's task bookkeeping
  // If set, a gRPC health service listens here (host:port): liveness
  // (common/grpc_server.h) from the start, readiness once connected to the
  // cluster.
  std::string health_listen;
  double slow_factor = 1.0;  // > 1: sleep to look that much slower
  // Test hook: exit abruptly (status 3) in the middle of the n-th task this
  // worker runs (1-based), after computing and before adding its gradient.
  int crash_at_task = 0;
  // Give up when the coordinator cannot be reached for this long.
  absl::Duration coordinator_timeout = absl::Seconds(60);
};

// Runs tasks until the coordinator says the job is done (OK).
absl::Status RunSandblasterWorker(const SandblasterWorkerOptions& options);

}  // namespace downpour

#endif  // DOWNPOUR_WORKER_SANDBLASTER_WORKER_H_
