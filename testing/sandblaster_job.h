// Runs one Sandblaster L-BFGS job on a fresh local cluster (scheduler, two
// servers, ps_lbfgs, ps_worker --job=lbfgs processes on 127.0.0.1) and
// returns its per-iteration objective and its summary. For tests and
// bench/lbfgs_bench.
#ifndef DOWNPOUR_TESTING_SANDBLASTER_JOB_H_
#define DOWNPOUR_TESTING_SANDBLASTER_JOB_H_

#include <functional>
#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/auth.h"
#include "launch/local_cluster.h"

namespace downpour {

struct SandblasterJobOptions {
  std::string bin_dir;   // holds scheduler/, server/, lbfgs/, worker/
  std::string work_dir;  // logs, trace and summary go here
  int num_servers = 2;
  std::vector<std::string> scheduler_flags;  // e.g. --replicas=2
  std::vector<std::string> server_flags;     // given to every server
  // Runs on its own thread once the workers are started (e.g. kills a
  // server); the job waits for it before returning.
  std::function<void(LocalCluster*)> while_running;
  // A failing coordinator is reported in the result (coordinator_exit_code,
  // coordinator_log) instead of as an error.
  bool allow_failure = false;
  std::vector<std::string> coordinator_flags;  // to ps_lbfgs
  // The scheduler keeps a --state_dir and the servers a --data_dir, so
  // that checkpoints can be taken.
  bool durable = false;
  // > 0: kill -9 the coordinator once its trace shows this iteration, and
  // start it again with the same flags at the same address (the workers
  // wait for it); the result's f is then both traces joined.
  int kill_coordinator_after = 0;
  // With kill_coordinator_after (and durable): the scheduler, the servers
  // and the workers are killed -9 with the coordinator, and all started
  // again (same state and data dirs, same flags; the workers as new
  // processes appended to worker_exit_codes) before it.
  bool kill_everything = false;
  std::vector<std::vector<std::string>> workers;  // flags, one per worker
  // The cluster's security, given to every process (--cluster_secret_file,
  // --tls_*); off by default.
  std::string cluster_secret_file;
  TlsFiles tls;
};

struct SandblasterJobResult {
  std::vector<double> f;        // objective by iteration (0: the start)
  std::vector<double> seconds;  // since the coordinator started minimizing
  std::map<std::string, std::string> summary;  // ps_lbfgs --summary_file
  std::vector<int> worker_exit_codes;          // -1: killed by a signal
  int coordinator_exit_code = 0;               // -1: killed by a signal
  std::string coordinator_log;                 // its tail, when it failed
  // With kill_coordinator_after: the last iteration the killed coordinator
  // traced, and the first the restarted one did (where it resumed).
  int killed_after = -1;
  int resumed_at = -1;
  double Num(const std::string& key) const;  // NaN when absent
};

// kInternal with the coordinator's log tail if it fails.
absl::StatusOr<SandblasterJobResult> RunSandblasterJob(
    const SandblasterJobOptions& options);

}  // namespace downpour

#endif  // DOWNPOUR_TESTING_SANDBLASTER_JOB_H_
