#include "launch/local_cluster.h"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "cluster/scheduler_client.h"
#include "common/address_file.h"
#include "common/status_macros.h"

namespace downpour {

std::string BinDirOfThisProgram() {
  char buf[4096];
  const ssize_t n = readlink("/proc/self/exe", buf, sizeof(buf) - 1);
  if (n <= 0) return ".";
  std::string exe(buf, n);
  exe = exe.substr(0, exe.rfind('/'));  // the program's folder
  return exe.substr(0, exe.rfind('/'));
}

absl::StatusOr<std::unique_ptr<LocalCluster>> LocalCluster::Start(
    const LocalClusterOptions& options) {
  std::unique_ptr<LocalCluster> c(new LocalCluster(options));
  const std::string address_file = options.work_dir + "/scheduler.address";
  std::remove(address_file.c_str());
  std::vector<std::string> argv = {options.bin_dir + "/scheduler/ps_scheduler",
                                   "--listen=127.0.0.1:0",
                                   "--address_file=" + address_file};
  if (options.durable) argv.push_back("--state_dir=" + c->state_dir());
  argv.insert(argv.end(), options.scheduler_flags.begin(),
              options.scheduler_flags.end());
  if (!options.cluster_secret_file.empty()) {
    argv.push_back("--cluster_secret_file=" + options.cluster_secret_file);
  }
  for (const std::string& flag : options.tls.ToFlags()) argv.push_back(flag);
  c->scheduler_ =
      std::make_unique<Subprocess>(argv, options.work_dir + "/scheduler.log");
  DP_RETURN_IF_ERROR(c->scheduler_->Start());
  DP_ASSIGN_OR_RETURN(c->scheduler_address_,
                      WaitForAddressFile(address_file, options.start_timeout,
                                         c->scheduler_.get()),
                      "start ps_scheduler");
  for (int i = 0; i < options.num_servers; ++i) {
    DP_RETURN_IF_ERROR(c->AddServer());
  }
  DP_RETURN_IF_ERROR(c->WaitForAliveServers(options.num_servers));
  return c;
}

LocalCluster::~LocalCluster() = default;  // Subprocess kills its child

absl::Status LocalCluster::AddServer() {
  const int index = static_cast<int>(servers_.size());
  std::vector<std::string> argv = {options_.bin_dir + "/server/ps_server",
                                   "--scheduler=" + scheduler_address_,
                                   absl::StrCat("--name=server-", index)};
  if (options_.durable) argv.push_back("--data_dir=" + data_dir(index));
  argv.insert(argv.end(), options_.server_flags.begin(),
              options_.server_flags.end());
  if (!options_.cluster_secret_file.empty()) {
    argv.push_back("--cluster_secret_file=" + options_.cluster_secret_file);
  }
  for (const std::string& flag : options_.tls.ToFlags()) argv.push_back(flag);
  servers_.push_back(std::make_unique<Subprocess>(
      argv, absl::StrCat(options_.work_dir, "/server-", index, ".log")));
  return servers_.back()->Start();
}

absl::Status LocalCluster::RestartServer(int i) {
  if (i < 0 || i >= num_servers() || servers_[i]->running()) {
    return absl::FailedPreconditionError(
        absl::StrCat("server ", i, " is not a stopped server"));
  }
  servers_[i] = std::make_unique<Subprocess>(
      servers_[i]->argv(),
      absl::StrCat(options_.work_dir, "/server-", i, ".restart.log"));
  return servers_[i]->Start();
}

std::string LocalCluster::data_dir(int i) const {
  return absl::StrCat(options_.work_dir, "/data/server-", i);
}

absl::Status LocalCluster::RestartScheduler() {
  if (scheduler_->running()) {
    return absl::FailedPreconditionError("the scheduler is running");
  }
  std::vector<std::string> argv = scheduler_->argv();
  for (std::string& a : argv) {
    // The same address: servers and clients know it.
    if (a.rfind("--listen=", 0) == 0) a = "--listen=" + scheduler_address_;
  }
  const std::string address_file = options_.work_dir + "/scheduler.address";
  std::remove(address_file.c_str());
  scheduler_ = std::make_unique<Subprocess>(
      argv, options_.work_dir + "/scheduler.restart.log");
  DP_RETURN_IF_ERROR(scheduler_->Start());
  DP_ASSIGN_OR_RETURN(std::string address,
                      WaitForAddressFile(address_file, options_.start_timeout,
                                         scheduler_.get()),
                      "restart ps_scheduler");
  (void)address;
  return absl::OkStatus();
}

absl::Status LocalCluster::WaitForAliveServers(int count) {
  DP_ASSIGN_OR_RETURN(ClusterAuth auth,
                      ClusterAuth::Load(options_.cluster_secret_file,
                                        options_.tls, kGrpcClient));
  SchedulerClient scheduler(scheduler_address_, absl::Seconds(10), auth);
  const absl::Time deadline = absl::Now() + options_.start_timeout;
  while (absl::Now() < deadline) {
    auto map = scheduler.GetClusterMap();
    if (map.ok()) {
      int alive = 0;
      for (const auto& n : map->nodes()) {
        alive += n.role() == proto::SERVER && n.state() == proto::ALIVE;
      }
      if (alive >= count) return absl::OkStatus();
    }
    for (auto& s : servers_) {
      if (s->running() && s->Wait(absl::ZeroDuration()).ok()) {
        return absl::InternalError(absl::StrCat(
            "a server exited during start-up; log:\n", s->LogTail()));
      }
    }
    absl::SleepFor(absl::Milliseconds(20));
  }
  return absl::DeadlineExceededError(
      absl::StrCat(count, " servers did not come up in time"));
}

absl::Status LocalCluster::Stop() {
  absl::Status result;
  for (auto& s : servers_) {
    if (s->running()) s->Signal(SIGTERM);
  }
  if (scheduler_ != nullptr && scheduler_->running()) {
    scheduler_->Signal(SIGTERM);
  }
  auto stop = [&result](Subprocess& p, const std::string& what) {
    if (!p.running()) return;
    auto status = p.Wait(absl::Seconds(30));
    if (!status.ok()) {
      p.Signal(SIGKILL);
      if (result.ok())
        result = absl::InternalError(absl::StrCat(what, " hung on SIGTERM"));
      return;
    }
    if (!(WIFEXITED(*status) && WEXITSTATUS(*status) == 0) && result.ok()) {
      result = absl::InternalError(absl::StrCat(
          what, " exited with wait status ", *status, "; log:\n", p.LogTail()));
    }
  };
  for (size_t i = 0; i < servers_.size(); ++i) {
    stop(*servers_[i], absl::StrCat("server ", i));
  }
  if (scheduler_ != nullptr) stop(*scheduler_, "scheduler");
  return result;
}

}  // namespace downpour
