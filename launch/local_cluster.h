// Starts a scheduler and N servers as real processes on 127.0.0.1 with free
// ports, for tests, benchmarks and the demo.
//
//   LocalClusterOptions o;
//   o.bin_dir = ...;          // folder holding scheduler/ps_scheduler and
//                             // server/ps_server (bazel-bin or runfiles)
//   o.work_dir = TestTmpDir();
//   auto cluster = LocalCluster::Start(o);
//   ... Client::Connect({.scheduler_address = (*cluster)->scheduler_address()})
//   EXPECT_OK((*cluster)->Stop());   // SIGTERM, every exit status checked
//
// Not thread-safe.
#ifndef DOWNPOUR_LAUNCH_LOCAL_CLUSTER_H_
#define DOWNPOUR_LAUNCH_LOCAL_CLUSTER_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/auth.h"
#include "common/subprocess.h"

namespace downpour {

// The build folder holding the calling program's own folder, e.g. bazel-bin
// for bazel-bin/tools/ps_demo: where scheduler/, server/ and worker/ are
// built. "." if /proc/self/exe cannot be read.
std::string BinDirOfThisProgram();

struct LocalClusterOptions {
  std::string bin_dir;   // required
  std::string work_dir;  // logs and address files go here; required
  int num_servers = 2;
  std::vector<std::string> scheduler_flags;
  std::vector<std::string> server_flags;  // given to every server
  // Given to the scheduler and every server (--cluster_secret_file), and
  // used by the cluster's own scheduler calls. Empty: no authentication.
  std::string cluster_secret_file;
  // gRPC over TLS: given to the scheduler and every server (--tls_* flags),
  // and used by the cluster's own scheduler calls. Off: plain gRPC.
  TlsFiles tls;
  absl::Duration start_timeout = absl::Seconds(30);
  // Durable runs: the scheduler keeps its state in <work_dir>/state, and
  // server i its checkpoints in <work_dir>/data/server-<i>.
  bool durable = false;
};

class LocalCluster {
 public:
  // Starts the scheduler, then the servers, and waits until the scheduler
  // lists every server as alive.
  static absl::StatusOr<std::unique_ptr<LocalCluster>> Start(
      const LocalClusterOptions& options);
  ~LocalCluster();  // kills what still runs

  const std::string& scheduler_address() const { return scheduler_address_; }
  int num_servers() const { return static_cast<int>(servers_.size()); }
  Subprocess& server(int i) { return *servers_[i]; }
  Subprocess& scheduler() { return *scheduler_; }

  // Starts one more server (name "server-<index>").
  absl::Status AddServer();
  // Starts server `i` again (same name and flags, a new process), e.g.
  // after a test killed it. REQUIRES: it is not running.
  absl::Status RestartServer(int i);
  // Starts the scheduler again on the same address (and state dir), e.g.
  // after a test killed it. REQUIRES: it is not running.
  absl::Status RestartScheduler();
  // Where server `i` keeps its checkpoints (durable runs).
  std::string data_dir(int i) const;
  std::string state_dir() const { return options_.work_dir + "/state"; }
  // Sends SIGTERM to every process at once (as Kubernetes stops a job),
  // then waits for each; kInternal naming the first that did not exit with
  // status 0 (killed ones are skipped).
  absl::Status Stop();

 private:
  explicit LocalCluster(const LocalClusterOptions& options)
      : options_(options) {}
  absl::Status WaitForAliveServers(int count);

  const LocalClusterOptions options_;
  std::string scheduler_address_;
  std::unique_ptr<Subprocess> scheduler_;
  std::vector<std::unique_ptr<Subprocess>> servers_;
};

}  // namespace downpour

#endif  // DOWNPOUR_LAUNCH_LOCAL_CLUSTER_H_
