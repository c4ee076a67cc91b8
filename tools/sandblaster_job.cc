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
#include "tools/local_cluster.h"

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
  LocalClusterOptions o;
  o.bin_dir = options.bin_dir;
  o.work_dir = dir;
  o.num_servers = options.num_servers;
  o.scheduler_flags = options.scheduler_flags;
  DP_ASSIGN_OR_RETURN(auto cluster, LocalCluster::Start(o));
  std::vector<std::string> argv = {
      options.bin_dir + "/lbfgs/ps_lbfgs",
      "--scheduler=" + cluster->scheduler_address(),
      "--address_file=" + dir + "/coordinator",
      "--trace_csv=" + dir + "/trace.csv", "--summary_file=" + dir + "/summary"};
  argv.insert(argv.end(), options.coordinator_flags.begin(),
              options.coordinator_flags.end());
  Subprocess coordinator(argv, dir + "/coordinator.log");
  DP_RETURN_IF_ERROR(coordinator.Start());
  DP_ASSIGN_OR_RETURN(std::string address,
                      WaitForAddressFile(dir + "/coordinator", absl::Seconds(60),
                                         &coordinator));
  std::vector<std::unique_ptr<Subprocess>> workers;
  for (size_t i = 0; i < options.workers.size(); ++i) {
    std::vector<std::string> w = {
        options.bin_dir + "/worker/ps_worker", "--job=lbfgs",
        "--scheduler=" + cluster->scheduler_address(),
        "--coordinator=" + address, "--name=w" + std::to_string(i)};
    w.insert(w.end(), options.workers[i].begin(), options.workers[i].end());
    workers.push_back(std::make_unique<Subprocess>(
        w, dir + "/worker" + std::to_string(i) + ".log"));
    DP_RETURN_IF_ERROR(workers.back()->Start());
  }
  std::thread during;
  if (options.while_running) {
    during = std::thread([&] { options.while_running(cluster.get()); });
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
  for (auto& w : workers) {
    DP_ASSIGN_OR_RETURN(int ws, w->Wait(absl::Seconds(30)));
    result.worker_exit_codes.push_back(WIFEXITED(ws) ? WEXITSTATUS(ws) : -1);
  }
  absl::Status stopped = cluster->Stop();
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
