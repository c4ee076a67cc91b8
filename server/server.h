// ps_server: a daemon that holds key ranges of tables and serves the data
// plane.
//
// Create() binds the ZeroMQ data socket and the gRPC admin service, loads
// handler plugins, registers with the scheduler (retrying until
// `connect_timeout`), applies the cluster map it gets back and starts
// serving. Background threads then heartbeat, and watch the cluster map to
// create the shards of newly declared tables (acknowledging each epoch to
// the scheduler once applied).
//
// With a data dir (`data_dir`, a RocksDB database) the server takes part in
// checkpoints and restores (server/internal/checkpointer.h), which the
// scheduler drives through the admin service.
//
// Thread-safe.
#ifndef DOWNPOUR_SERVER_SERVER_H_
#define DOWNPOUR_SERVER_SERVER_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/auth.h"
#include "common/types.h"
#include "metrics/registry.h"

namespace downpour {

struct ServerOptions {
  std::string scheduler_address;  // host:port of ps_scheduler; required
  // Stable identity: a server that restarts under the same name after being
  // declared dead takes its old id (and key ranges) back.
  std::string name;
  std::string data_bind = "tcp://127.0.0.1:*";  // "*" = any free port
  // Host put in the advertised data endpoint instead of the bound one (e.g.
  // the pod IP when binding 0.0.0.0). Empty: as bound.
  std::string advertise_host;
  std::string admin_listen = "127.0.0.1:0";  // gRPC admin + health
  size_t max_message_bytes = size_t{256} << 20;
  // Table storage (values, handler state, named vectors of every range held
  // as primary or backup) this server takes on; a table or range beyond it
  // is refused (kResourceExhausted, reported to the scheduler) instead of
  // allocated. Reported at registration, so that the scheduler refuses a
  // table that does not fit before declaring it. 0: no limit (ps_server
  // sets a share of the memory available at start).
  uint64_t max_table_bytes = 0;
  // Range reads of dense parameters at least this large are sent from the
  // table without copying (writes to those rows wait until sent); SIZE_MAX:
  // always copy.
  size_t zero_copy_min_bytes = size_t{256} << 10;
  std::vector<std::string> plugin_paths;  // update-handler plugins (.so)
  absl::Duration connect_timeout = absl::Seconds(30);
  // The data plane admits only peers with the cluster secret (if any); the
  // admin service and scheduler calls use its token and TLS settings
  // (common/auth.h).
  ClusterAuth auth;
  // Checkpoints of the ranges this server serves as primary are kept here
  // (needs a name: a checkpoint restores onto the server of the same name).
  // Empty: no checkpoints (the scheduler's fail on this server).
  std::string data_dir;
  // Fault injection (tests, drills): writes to the data dir fail as on a
  // full disk after this many bytes (0: never).
  uint64_t inject_disk_full_after_bytes = 0;
  // If set (borrowed; must outlive the server), the server adds its
  // figures to it and times every data-plane request per operation and
  // table (server/stats_metrics.h).
  MetricsRegistry* metrics = nullptr;
  // Fault injection (tests, drills): copies of ranges to new backups send
  // one 4 MiB chunk per `inject_copy_delay` at most, so that a move lasts
  // long enough to be interrupted; a handover is reported to the
  // scheduler `inject_handover_delay` late (writes to the range are
  // refused meanwhile).
  absl::Duration inject_copy_delay = absl::ZeroDuration();
  absl::Duration inject_handover_delay = absl::ZeroDuration();
  // Fault injection (tests): if set, copies of ranges send their rows but
  // do not end (COPY_END) until a file of this path exists, so that a test
  // holds a copy, and its move, under way for as long as it needs; and a
  // primary handing a range over does not report it ready until a file of
  // `inject_handover_gate` exists. With `inject_gate_node`, only the moves
  // from or to the server of that name are held.
  std::string inject_copy_gate;
  std::string inject_handover_gate;
  std::string inject_gate_node;
};

class Server {
 public:
  // kInvalidArgument for bad options, kUnavailable if a socket cannot be
  // bound or the scheduler cannot be reached in time, plugin load errors.
  static absl::StatusOr<std::unique_ptr<Server>> Create(
      const ServerOptions& options);
  virtual ~Server() = default;

  virtual NodeId id() const = 0;
  virtual const std::string& data_endpoint() const = 0;
  virtual std::string admin_address() const = 0;

  // Blocks until Shutdown() is called (OK), the server was drained and
  // left the cluster (OK; psctl drain, DrainAndLeave), or the server cannot
  // go on (e.g. the scheduler handed its name to a different id).
  virtual absl::Status Wait() = 0;
  // Drains this server (Scheduler.Drain): its ranges move to other servers
  // while it keeps serving; once it holds none it leaves the cluster
  // (LEFT, not a failure) and Wait() returns OK. Blocks up to `timeout`
  // (another drain under way is waited for); true once it has left. False
  // when the scheduler refuses (this server is among the last that hold
  // the ranges) or cannot be reached, or time ran out (the drain is then
  // called off and the server keeps the ranges it still holds).
  virtual bool DrainAndLeave(absl::Duration timeout) = 0;
  // Stops every thread and closes the sockets. Idempotent.
  virtual void Shutdown() = 0;
  // Before Shutdown on SIGTERM, with a data dir: reports not ready and
  // keeps serving until a checkpoint that starts within `start_wait` of
  // `since` (the signal; a drain may have come first) has completed (the
  // scheduler takes one when it is stopped too), until `since` + `grace`
  // at most. True if one completed.
  virtual bool AwaitLastCheckpoint(absl::Duration start_wait,
                                   absl::Duration grace, absl::Time since) = 0;
};

}  // namespace downpour

#endif  // DOWNPOUR_SERVER_SERVER_H_
