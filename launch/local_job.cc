#include "launch/local_job.h"

#include <signal.h>
#include <sys/wait.h>

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/status_macros.h"

namespace downpour {

absl::StatusOr<std::unique_ptr<LocalJob>> LocalJob::Start(
    const LocalJobOptions& options) {
  std::unique_ptr<LocalJob> job(new LocalJob(options));
  DP_ASSIGN_OR_RETURN(job->cluster_, LocalCluster::Start(options.cluster));
  for (const std::vector<std::string>& flags : options.workers) {
    DP_RETURN_IF_ERROR(job->AddWorker(flags));
  }
  return job;
}

LocalJob::~LocalJob() = default;  // Subprocess kills its child

absl::Status LocalJob::AddWorker(const std::vector<std::string>& flags) {
  const int i = num_workers();
  std::vector<std::string> argv = {
      options_.cluster.bin_dir + "/worker/ps_worker",
      "--scheduler=" + cluster_->scheduler_address(),
      absl::StrCat("--name=", options_.worker_name_prefix, i)};
  if (!options_.cluster.cluster_secret_file.empty()) {
    argv.push_back("--cluster_secret_file=" +
                   options_.cluster.cluster_secret_file);
  }
  for (const std::string& flag : options_.cluster.tls.ToFlags()) {
    argv.push_back(flag);
  }
  argv.insert(argv.end(), flags.begin(), flags.end());
  Worker w;
  w.process = std::make_unique<Subprocess>(
      argv, absl::StrCat(options_.cluster.work_dir, "/worker-", i, ".log"));
  DP_RETURN_IF_ERROR(w.process->Start(), "start worker ", i);
  workers_.push_back(std::move(w));
  return absl::OkStatus();
}

absl::StatusOr<int> LocalJob::WaitForWorker(int i, absl::Duration timeout) {
  Worker& w = workers_[i];
  if (!w.wait_status) {
    DP_ASSIGN_OR_RETURN(w.wait_status, w.process->Wait(timeout), "worker ", i);
  }
  return *w.wait_status;
}

absl::Status LocalJob::CheckExit(int i) const {
  const int st = *workers_[i].wait_status;
  if (WIFEXITED(st) && WEXITSTATUS(st) == 0) return absl::OkStatus();
  return absl::InternalError(absl::StrCat(
      "worker ", i,
      WIFEXITED(st) ? absl::StrCat(" exited with status ", WEXITSTATUS(st))
                    : absl::StrCat(" was killed by signal ", WTERMSIG(st)),
      "; log ", workers_[i].process->log_path(), ":\n",
      workers_[i].process->LogTail()));
}

absl::StatusOr<std::vector<int>> LocalJob::WaitForWorkerExits(
    absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  std::vector<int> codes;
  for (int i = 0; i < num_workers(); ++i) {
    DP_ASSIGN_OR_RETURN(
        int st, WaitForWorker(
                    i, std::max(deadline - absl::Now(), absl::ZeroDuration())));
    codes.push_back(WIFEXITED(st) ? WEXITSTATUS(st) : -1);
  }
  return codes;
}

absl::Status LocalJob::WaitForWorkers(absl::Duration timeout) {
  DP_RETURN_IF_ERROR(WaitForWorkerExits(timeout).status());
  for (int i = 0; i < num_workers(); ++i) DP_RETURN_IF_ERROR(CheckExit(i));
  return absl::OkStatus();
}

absl::StatusOr<int> LocalJob::PollWorkers() {
  int running = 0;
  for (int i = 0; i < num_workers(); ++i) {
    if (!workers_[i].wait_status) {
      auto st = workers_[i].process->Wait(absl::ZeroDuration());
      if (!st.ok()) {
        ++running;
        continue;
      }
      workers_[i].wait_status = *st;
    }
    DP_RETURN_IF_ERROR(CheckExit(i));
  }
  return running;
}

absl::Status LocalJob::Stop() {
  for (Worker& w : workers_) {
    if (!w.wait_status && w.process->running()) {
      w.process->Signal(SIGKILL);
      auto st = w.process->Wait(absl::Seconds(10));
      if (st.ok()) w.wait_status = *st;
    }
  }
  return cluster_->Stop();
}

}  // namespace downpour
