// A training job on loopback, for integration tests, benchmarks and the
// demo: a local cluster (launch/local_cluster.h: a scheduler and servers)
// plus ps_worker processes, and a check of how every one of them ended.
//
//   LocalJobOptions o;
//   o.cluster.bin_dir = RunfilePath("");
//   o.cluster.work_dir = dir;
//   o.cluster.scheduler_flags = {"--consistency=bsp", "--num_workers=2"};
//   o.workers = {{"--model=softmax", "--steps=25"},
//                {"--model=softmax", "--steps=25"}};
//   DP_ASSIGN_OR_RETURN(std::unique_ptr<LocalJob> job, LocalJob::Start(o));
//   DP_RETURN_IF_ERROR(job->WaitForWorkers(absl::Minutes(4)));  // all exit 0
//   ... read the tables at job->scheduler_address() ...
//   DP_RETURN_IF_ERROR(job->Stop());
//
// Worker i runs `<bin_dir>/worker/ps_worker --scheduler=<address>
// --name=<worker_name_prefix><i> [--cluster_secret_file=...] [--tls_*]
// <its flags>` (the cluster's security, as LocalClusterOptions has it)
// with its output in `<work_dir>/worker-<i>.log`.
//
// Not thread-safe.
#ifndef DOWNPOUR_LAUNCH_LOCAL_JOB_H_
#define DOWNPOUR_LAUNCH_LOCAL_JOB_H_

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/subprocess.h"
#include "launch/local_cluster.h"

namespace downpour {

struct LocalJobOptions {
  // The scheduler's flags set the job: --consistency, --num_workers, ...
  LocalClusterOptions cluster;
  // One entry per worker started with the job: its flags.
  std::vector<std::vector<std::string>> workers;
  std::string worker_name_prefix = "w";
};

class LocalJob {
 public:
  // Starts the cluster, then the workers. The cluster's errors
  // (LocalCluster::Start), or kInternal if a worker cannot be started.
  static absl::StatusOr<std::unique_ptr<LocalJob>> Start(
      const LocalJobOptions& options);
  ~LocalJob();  // kills what still runs

  LocalCluster& cluster() { return *cluster_; }
  const std::string& scheduler_address() const {
    return cluster_->scheduler_address();
  }

  // Starts one more worker (index num_workers()) with `flags`.
  absl::Status AddWorker(const std::vector<std::string>& flags);
  int num_workers() const { return static_cast<int>(workers_.size()); }
  Subprocess& worker(int i) { return *workers_[i].process; }

  // Waits until worker i has exited and returns its raw wait status (kept:
  // asking again returns it at once). kDeadlineExceeded after `timeout`.
  absl::StatusOr<int> WaitForWorker(int i, absl::Duration timeout);
  // Waits until every worker has exited (kDeadlineExceeded, naming the
  // first still running, after `timeout` in all); kInternal naming the
  // first that did not exit with status 0, with its log tail.
  absl::Status WaitForWorkers(absl::Duration timeout);
  // Every worker's exit code once all have exited, -1 for one killed by a
  // signal. kDeadlineExceeded after `timeout` in all.
  absl::StatusOr<std::vector<int>> WaitForWorkerExits(absl::Duration timeout);
  // Without blocking: how many workers still run; kInternal (naming the
  // worker, with its log tail) once one has exited with another status
  // than 0.
  absl::StatusOr<int> PollWorkers();

  // Kills the workers still running (SIGKILL), then stops the cluster
  // (LocalCluster::Stop: its errors).
  absl::Status Stop();

 private:
  struct Worker {
    std::unique_ptr<Subprocess> process;
    std::optional<int> wait_status;  // once it has exited
  };
  explicit LocalJob(const LocalJobOptions& options) : options_(options) {}
  // kInternal for worker i's wait status unless it is a clean exit.
  absl::Status CheckExit(int i) const;

  const LocalJobOptions options_;
  std::unique_ptr<LocalCluster> cluster_;
  std::vector<Worker> workers_;
};

}  // namespace downpour

#endif  // DOWNPOUR_LAUNCH_LOCAL_JOB_H_
