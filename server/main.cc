// ps_server: serves key ranges of tables. See server/server.h.
#include <algorithm>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/auth.h"
#include "common/host_memory.h"
#include "common/logging.h"
#include "common/program.h"
#include "common/signals.h"
#include "metrics/metrics_flags.h"
#include "server/server.h"

ABSL_FLAG(std::string, scheduler, "127.0.0.1:7070",
          "host:port of the ps_scheduler");
ABSL_FLAG(std::string, name, "",
          "stable name; a restarted server with the same name takes its key "
          "ranges back");
ABSL_FLAG(std::string, data_listen, "tcp://127.0.0.1:*",
          "ZeroMQ endpoint of the data plane (* = any free port)");
ABSL_FLAG(std::string, advertise_host, "",
          "host to advertise instead of the bound one (e.g. the pod IP)");
ABSL_FLAG(std::string, admin_listen, "127.0.0.1:0",
          "gRPC admin and health service address (port 0 = any)");
ABSL_FLAG(int64_t, max_message_mb, 256,
          "largest request or reply accepted, in MiB");
ABSL_FLAG(std::vector<std::string>, handler_plugins, {},
          "comma-separated update-handler plugins (.so) to load");
ABSL_FLAG(int64_t, zero_copy_min_kb, 256,
          "range reads of dense tables of at least this many KiB are sent "
          "without copying; -1: always copy");
ABSL_FLAG(int64_t, max_table_bytes, -1,
          "table storage (values, handler state, named vectors of every "
          "range held) this server takes on; tables beyond it are refused "
          "with RESOURCE_EXHAUSTED, by the scheduler before they are "
          "declared. -1: 80% of the memory available at start (MemAvailable, "
          "or the cgroup's limit if lower); 0: no limit");
ABSL_FLAG(int64_t, connect_timeout_s, 30,
          "how long to keep trying to reach the scheduler at start-up");
ABSL_FLAG(std::string, data_dir, "",
          "keep checkpoints of this server's ranges here (RocksDB); needs "
          "--name. Empty: the server cannot take part in checkpoints");
ABSL_FLAG(int64_t, inject_disk_full_after_mb, 0,
          "fault injection (tests, drills): writes to --data_dir fail as on "
          "a full disk after this many MiB (0: never)");
ABSL_FLAG(int64_t, shutdown_grace_s, 25,
          "on SIGTERM with --data_dir: keep serving until the scheduler's "
          "last checkpoint completes, at most this long");
ABSL_FLAG(bool, drain_on_sigterm, false,
          "on SIGTERM: move every key range this server holds to other "
          "servers while it keeps serving, then leave the cluster (LEFT, not "
          "a failure) and exit 0 (a Kubernetes scale-down). If the "
          "scheduler refuses (the last servers that can hold the ranges) or "
          "is stopping too, stop as without this flag");
ABSL_FLAG(int64_t, drain_timeout_s, 45,
          "--drain_on_sigterm: give up draining after this long (the drain "
          "is called off and the server stops as without the flag)");
ABSL_FLAG(int64_t, inject_copy_delay_ms, 0,
          "fault injection (tests, drills): send copies of ranges to new "
          "backups one 4 MiB chunk per this many ms at most");
ABSL_FLAG(std::string, inject_copy_gate, "",
          "fault injection (tests): copies of ranges to new backups send "
          "their rows but do not end until a file of this path exists");
ABSL_FLAG(std::string, inject_handover_gate, "",
          "fault injection (tests): a primary handing a range over does not "
          "report it ready until a file of this path exists");
ABSL_FLAG(std::string, inject_gate_node, "",
          "fault injection (tests): --inject_copy_gate and "
          "--inject_handover_gate hold only the moves from or to the server "
          "of this name (empty: every copy and handover)");
ABSL_FLAG(int64_t, inject_handover_delay_ms, 0,
          "fault injection (tests, drills): report a handover to the "
          "scheduler this many ms late");
ABSL_FLAG(int64_t, shutdown_checkpoint_wait_s, 3,
          "on SIGTERM with --data_dir: stop at once if no checkpoint starts "
          "within this long");

int main(int argc, char** argv) {
  downpour::ProgramStart start;
  start.usage =
      "the Downpour parameter server, holding key ranges of tables "
      "(usage: ps_server --scheduler=HOST:PORT --name=NAME [flags])";
  start.tune_allocator = true;
  start.block_termination_signals = true;
  if (!downpour::StartProgram(argc, argv, start).ok()) return 2;

  downpour::ServerOptions options;
  options.scheduler_address = absl::GetFlag(FLAGS_scheduler);
  options.name = absl::GetFlag(FLAGS_name);
  options.data_bind = absl::GetFlag(FLAGS_data_listen);
  options.advertise_host = absl::GetFlag(FLAGS_advertise_host);
  options.admin_listen = absl::GetFlag(FLAGS_admin_listen);
  options.max_message_bytes =
      static_cast<size_t>(absl::GetFlag(FLAGS_max_message_mb)) << 20;
  options.plugin_paths = absl::GetFlag(FLAGS_handler_plugins);
  const int64_t zero_copy_kb = absl::GetFlag(FLAGS_zero_copy_min_kb);
  options.zero_copy_min_bytes =
      zero_copy_kb < 0 ? SIZE_MAX : static_cast<size_t>(zero_copy_kb) << 10;
  options.connect_timeout =
      absl::Seconds(absl::GetFlag(FLAGS_connect_timeout_s));
  const int64_t max_table_bytes = absl::GetFlag(FLAGS_max_table_bytes);
  if (max_table_bytes >= 0) {
    options.max_table_bytes = static_cast<uint64_t>(max_table_bytes);
  } else {
    auto available = downpour::AvailableMemoryBytes();
    if (!available.ok()) {
      DP_LOG(ERROR) << "--max_table_bytes=-1: " << available.status()
                    << "; give a limit (or 0 for none)";
      return 2;
    }
    // The rest is for requests in flight, BSP steps being aggregated,
    // replication and the process itself.
    options.max_table_bytes = *available / 5 * 4;
  }
  DP_LOG(INFO) << "table memory limit: "
               << (options.max_table_bytes == 0
                       ? std::string("none")
                       : absl::StrCat(options.max_table_bytes >> 20, " MiB"));
  auto auth = downpour::ClusterAuth::FromFlags(downpour::kGrpcClientAndServer);
  if (!auth.ok()) {
    DP_LOG(ERROR) << auth.status();
    return 2;
  }
  options.auth = *auth;
  options.data_dir = absl::GetFlag(FLAGS_data_dir);
  options.inject_disk_full_after_bytes =
      static_cast<uint64_t>(
          std::max<int64_t>(0, absl::GetFlag(FLAGS_inject_disk_full_after_mb)))
      << 20;
  const absl::Duration grace =
      absl::Seconds(absl::GetFlag(FLAGS_shutdown_grace_s));
  const absl::Duration start_wait =
      absl::Seconds(absl::GetFlag(FLAGS_shutdown_checkpoint_wait_s));
  const bool drain_on_sigterm = absl::GetFlag(FLAGS_drain_on_sigterm);
  const absl::Duration drain_timeout =
      absl::Seconds(absl::GetFlag(FLAGS_drain_timeout_s));
  options.inject_copy_delay = absl::Milliseconds(
      std::max<int64_t>(0, absl::GetFlag(FLAGS_inject_copy_delay_ms)));
  options.inject_copy_gate = absl::GetFlag(FLAGS_inject_copy_gate);
  options.inject_handover_gate = absl::GetFlag(FLAGS_inject_handover_gate);
  options.inject_gate_node = absl::GetFlag(FLAGS_inject_gate_node);
  options.inject_handover_delay = absl::Milliseconds(
      std::max<int64_t>(0, absl::GetFlag(FLAGS_inject_handover_delay_ms)));
  downpour::MetricsRegistry metrics;
  auto endpoint = downpour::StartMetricsFromFlags(&metrics);
  if (!endpoint.ok()) {
    DP_LOG(ERROR) << endpoint.status();
    return 2;
  }
  if (*endpoint != nullptr) options.metrics = &metrics;

  auto server = downpour::Server::Create(options);
  if (!server.ok()) {
    DP_LOG(ERROR) << "cannot start: " << server.status();
    return 1;
  }
  // The handler runs on its own thread while main() may be finishing on
  // its own (a drained server's Wait returned): Disarm() waits for it before
  // the server is destroyed, and a signal after that is ignored.
  downpour::TerminationHandler on_signal = downpour::OnTerminationSignal(
      [s = server->get(), grace, start_wait, drain_on_sigterm, drain_timeout] {
        const absl::Time since = absl::Now();
        // A scale-down: the ranges go to the other servers first, then
        // Wait() returns. (When the whole job stops, the scheduler refuses
        // or calls the drain off.)
        if (!drain_on_sigterm || !s->DrainAndLeave(drain_timeout)) {
          // Kubernetes stops every pod of the job at once; the scheduler
          // then takes a last checkpoint, which needs this server's data.
          s->AwaitLastCheckpoint(start_wait, grace, since);
          s->Shutdown();
        }
      });
  absl::Status status = (*server)->Wait();
  (*server)->Shutdown();
  on_signal.Disarm();
  if (!status.ok()) {
    DP_LOG(ERROR) << status;
    return 1;
  }
  return 0;
}
