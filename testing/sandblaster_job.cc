#include "testing/sandblaster_job.h"

#include <signal.h>
#include <sys/wait.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/address_file.h"
#include "common/status_macros.h"
#include "common/subprocess.h"
#include "launch/local_job.h"

namespace downpour {
double SandblasterJobResult::Num(const std::string& key) const {
  double v = NAN;
  auto it = summary.find(key);
  if (it != summary.end() && !absl::SimpleAtod(it->second, &v)) v = NAN;
  return v;
}

namespace {

struct TraceLine {
  int iteration;
  double f, seconds;
};

// ps_lbfgs --trace_csv: iteration,f,gnorm,step,evaluations,seconds. A last
// line without its newline is still being written and is left out.
absl::StatusOr<std::vector<TraceLine>> ReadTrace(const std::string& path) {
  std::ifstream in(path);
  std::string text((std::istreambuf_iterator<char>(in)),
                   std::istreambuf_iterator<char>());
  std::vector<TraceLine> out;
  std::vector<absl::string_view> lines = absl::StrSplit(text, '\n');
  lines.pop_back();                            // after the last newline
  for (size_t i = 1; i < lines.size(); ++i) {  // 0: the header
    std::vector<absl::string_view> cols = absl::StrSplit(lines[i], ',');
    TraceLine t;
    if (cols.size() < 6 || !absl::SimpleAtoi(cols[0], &t.iteration) ||
        !absl::SimpleAtod(cols[1], &t.f) ||
        !absl::SimpleAtod(cols[5], &t.seconds)) {
      return absl::DataLossError(absl::StrCat("bad trace line: ", lines[i]));
    }
    out.push_back(t);
  }
  return out;
}

}  // namespace

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
  o.cluster.server_flags = options.server_flags;
  o.cluster.durable = options.durable;
  // LocalJob gives them to the scheduler, the servers and the workers.
  o.cluster.cluster_secret_file = options.cluster_secret_file;
  o.cluster.tls = options.tls;
  // The workers start once the coordinator is up.
  DP_ASSIGN_OR_RETURN(std::unique_ptr<LocalJob> job, LocalJob::Start(o));
  std::vector<std::string> security = options.tls.ToFlags();
  if (!options.cluster_secret_file.empty()) {
    security.push_back("--cluster_secret_file=" + options.cluster_secret_file);
  }
  std::vector<std::string> argv = {options.bin_dir + "/lbfgs/ps_lbfgs",
                                   "--scheduler=" + job->scheduler_address(),
                                   "--address_file=" + dir + "/coordinator",
                                   "--trace_csv=" + dir + "/trace.csv",
                                   "--summary_file=" + dir + "/summary"};
  argv.insert(argv.end(), security.begin(), security.end());
  argv.insert(argv.end(), options.coordinator_flags.begin(),
              options.coordinator_flags.end());
  auto coordinator =
      std::make_unique<Subprocess>(argv, dir + "/coordinator.log");
  DP_RETURN_IF_ERROR(coordinator->Start());
  DP_ASSIGN_OR_RETURN(std::string address,
                      WaitForAddressFile(dir + "/coordinator",
                                         absl::Seconds(60), coordinator.get()));
  for (const std::vector<std::string>& flags : options.workers) {
    std::vector<std::string> w = {"--job=lbfgs", "--coordinator=" + address};
    w.insert(w.end(), flags.begin(), flags.end());
    DP_RETURN_IF_ERROR(job->AddWorker(w));
  }
  std::thread during;
  if (options.while_running) {
    during = std::thread([&] { options.while_running(&job->cluster()); });
  }
  SandblasterJobResult result;
  std::vector<TraceLine> first_trace;
  if (options.kill_coordinator_after > 0) {
    const absl::Time deadline = absl::Now() + absl::Minutes(5);
    while (coordinator->running() && absl::Now() < deadline) {
      DP_ASSIGN_OR_RETURN(first_trace, ReadTrace(dir + "/trace.csv"));
      if (!first_trace.empty() &&
          first_trace.back().iteration >= options.kill_coordinator_after) {
        break;
      }
      absl::SleepFor(absl::Milliseconds(5));
    }
    coordinator->Signal(SIGKILL);
    DP_RETURN_IF_ERROR(coordinator->Wait(absl::Seconds(10)).status());
    // What it traced before it died (a line is written whole per flush).
    DP_ASSIGN_OR_RETURN(first_trace, ReadTrace(dir + "/trace.csv"));
    if (first_trace.empty()) {
      return absl::InternalError(
          "the coordinator traced nothing before the kill");
    }
    result.killed_after = first_trace.back().iteration;
    const int first_workers = job->num_workers();
    if (options.kill_everything) {
      LocalCluster& cluster = job->cluster();
      for (int i = 0; i < first_workers; ++i) job->worker(i).Signal(SIGKILL);
      cluster.scheduler().Signal(SIGKILL);
      for (int i = 0; i < cluster.num_servers(); ++i) {
        cluster.server(i).Signal(SIGKILL);
      }
      for (int i = 0; i < first_workers; ++i) {
        DP_RETURN_IF_ERROR(job->WaitForWorker(i, absl::Seconds(10)).status());
      }
      DP_RETURN_IF_ERROR(cluster.scheduler().Wait(absl::Seconds(10)).status());
      for (int i = 0; i < cluster.num_servers(); ++i) {
        DP_RETURN_IF_ERROR(cluster.server(i).Wait(absl::Seconds(10)).status());
      }
      DP_RETURN_IF_ERROR(cluster.RestartScheduler());
      for (int i = 0; i < cluster.num_servers(); ++i) {
        DP_RETURN_IF_ERROR(cluster.RestartServer(i));
      }
    }
    std::vector<std::string> again = argv;
    for (std::string& a : again) {
      if (absl::StartsWith(a, "--trace_csv="))
        a = "--trace_csv=" + dir + "/trace2.csv";
    }
    again.push_back("--listen=" + address);
    coordinator =
        std::make_unique<Subprocess>(again, dir + "/coordinator2.log");
    DP_RETURN_IF_ERROR(coordinator->Start());
    if (options.kill_everything) {
      for (const std::vector<std::string>& flags : options.workers) {
        std::vector<std::string> w = {"--job=lbfgs",
                                      "--coordinator=" + address};
        w.insert(w.end(), flags.begin(), flags.end());
        DP_RETURN_IF_ERROR(job->AddWorker(w));
      }
    }
  }
  absl::StatusOr<int> status = coordinator->Wait(absl::Minutes(10));
  if (during.joinable()) during.join();
  DP_RETURN_IF_ERROR(status.status());
  result.coordinator_exit_code = WIFEXITED(*status) ? WEXITSTATUS(*status) : -1;
  if (result.coordinator_exit_code != 0) {
    result.coordinator_log = coordinator->LogTail();
    if (!options.allow_failure) {
      return absl::InternalError("coordinator failed: " +
                                 result.coordinator_log);
    }
  }
  // Some exit on purpose (crash_at_task): their codes are the result.
  DP_ASSIGN_OR_RETURN(result.worker_exit_codes,
                      job->WaitForWorkerExits(absl::Seconds(30)));
  absl::Status stopped = job->Stop();
  // A server killed on purpose is skipped by Stop; others must stop cleanly.
  if (!options.allow_failure) DP_RETURN_IF_ERROR(stopped);
  std::vector<TraceLine> trace;
  if (options.kill_coordinator_after > 0) {
    DP_ASSIGN_OR_RETURN(std::vector<TraceLine> second,
                        ReadTrace(dir + "/trace2.csv"));
    if (second.empty()) {
      return absl::InternalError("the restarted coordinator traced nothing");
    }
    result.resumed_at = second.front().iteration;
    for (const TraceLine& t : first_trace) {
      if (t.iteration < result.resumed_at) trace.push_back(t);
    }
    trace.insert(trace.end(), second.begin(), second.end());
  } else {
    DP_ASSIGN_OR_RETURN(trace, ReadTrace(dir + "/trace.csv"));
  }
  for (const TraceLine& t : trace) {
    if (t.iteration != static_cast<int>(result.f.size())) {
      return absl::DataLossError(absl::StrCat("trace: iteration ", t.iteration,
                                              " at line ", result.f.size()));
    }
    result.f.push_back(t.f);
    result.seconds.push_back(t.seconds);
  }
  std::string line;
  std::ifstream summary(dir + "/summary");
  while (std::getline(summary, line)) {
    std::pair<std::string, std::string> kv = absl::StrSplit(line, '=');
    result.summary[kv.first] = kv.second;
  }
  return result;
}

}  // namespace downpour
