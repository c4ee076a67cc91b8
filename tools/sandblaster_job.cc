#include "tools/sandblaster_job.h"

#include <sys/wait.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <thread>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "common/address_file.h"
#include "common/status_macros.h"
#include "common/subprocess.h"
#include "tools/local_job.h"

namespace downpour {
double SandblasterJobResult::Num(const std::string& key) const {
  double v = NAN;
  auto it = summary.find(key);
  if (it != summary.end() && !absl::SimpleAtod(it->second, &v)) v = NAN;
  return v;
}

absl::StatusOr<SandblasterJobResult> RunSandblasterJob(
    const SandblasterJobOptions& options) {
  const std::string& dir = options.work_dir;
  // A previous run's address file would send the workers to a dead port.
  std::error_code ignored;
  std::filesystem::remove_all(dir, ignored);
  std::filesystem::create_directories(dir);
  LocalJobOptions o;
  o.cluster.bin_dir = options.bin_dir;
  o.cluster.work_dir = dir;
  o.cluster.num_servers = options.num_servers;
  o.cluster.scheduler_flags = options.scheduler_flags;
  // The workers start once the coordinator is up.
  DP_ASSIGN_OR_RETURN(std::unique_ptr<LocalJob> job, LocalJob::Start(o));
  std::vector<std::string> argv = {
      options.bin_dir + "/lbfgs/ps_lbfgs",
      "--scheduler=" + job->scheduler_address(),
      "--address_file=" + dir + "/coordinator",
      "--trace_csv=" + dir + "/trace.csv", "--summary_file=" + dir + "/summary"};
  argv.insert(argv.end(), options.coordinator_flags.begin(),
              options.coordinator_flags.end());
  Subprocess coordinator(argv, dir + "/coordinator.log");
  DP_RETURN_IF_ERROR(coordinator.Start());
  DP_ASSIGN_OR_RETURN(std::string address,
                      WaitForAddressFile(dir + "/coordinator", absl::Seconds(60),
                                         &coordinator));
  for (const std::vector<std::string>& flags : options.workers) {
    std::vector<std::string> w = {"--job=lbfgs", "--coordinator=" + address};
    w.insert(w.end(), flags.begin(), flags.end());
    DP_RETURN_IF_ERROR(job->AddWorker(w));
  }
  std::thread during;
  if (options.while_running) {
    during = std::thread([&] { options.while_running(&job->cluster()); });
  }
  absl::StatusOr<int> status = coordinator.Wait(absl::Minutes(10));
  if (during.joinable()) during.join();
  DP_RETURN_IF_ERROR(status.status());
  SandblasterJobResult result;
  result.coordinator_exit_code = WIFEXITED(*status) ? WEXITSTATUS(*status) : -1;
  if (result.coordinator_exit_code != 0) {
    result.coordinator_log = coordinator.LogTail();
    if (!options.allow_failure) {
      return absl::InternalError("coordinator failed: " + result.coordinator_log);
    }
  }
  // Some exit on purpose (crash_at_task): their codes are the result.
  DP_ASSIGN_OR_RETURN(result.worker_exit_codes,
                      job->WaitForWorkerExits(absl::Seconds(30)));
  absl::Status stopped = job->Stop();
  // A server killed on purpose is skipped by Stop; others must stop cleanly.
  if (!options.allow_failure) DP_RETURN_IF_ERROR(stopped);
  std::ifstream trace(dir + "/trace.csv");
  std::string line;
  std::getline(trace, line);  // header
  while (std::getline(trace, line)) {
    std::vector<std::string> cols = absl::StrSplit(line, ',');
    double f, s;
    if (cols.size() < 6 || !absl::SimpleAtod(cols[1], &f) ||
        !absl::SimpleAtod(cols[5], &s)) {
      return absl::DataLossError("bad trace line: " + line);
    }
    result.f.push_back(f);
    result.seconds.push_back(s);
  }
  std::ifstream summary(dir + "/summary");
  while (std::getline(summary, line)) {
    std::pair<std::string, std::string> kv = absl::StrSplit(line, '=');
    result.summary[kv.first] = kv.second;
  }
  return result;
}

}  // namespace downpour
