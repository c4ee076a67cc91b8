// ps_scheduler: membership, cluster map and barriers. See scheduler.h.
#include <algorithm>
#include <string>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "common/address_file.h"
#include "common/auth.h"
#include "common/logging.h"
#include "common/program.h"
#include "common/signals.h"
#include "common/token_file.h"
#include "metrics/metrics_flags.h"
#include "scheduler/scheduler.h"

ABSL_FLAG(std::string, listen, "127.0.0.1:7070", "gRPC listen address");
ABSL_FLAG(std::string, address_file, "",
          "if set, write \"127.0.0.1:<port>\" here once listening");
ABSL_FLAG(int64_t, heartbeat_interval_ms, 200, "heartbeat interval for nodes");
ABSL_FLAG(int64_t, dead_after_ms, 3000,
          "a node silent this long is declared dead");
ABSL_FLAG(int64_t, suspect_grace_ms, 400,
          "a node reported unreachable (a broken connection) and silent this "
          "long after the report is declared dead");
ABSL_FLAG(int32_t, replicas, 1,
          "servers holding each key range: a primary and replicas - 1 "
          "backups (writes are acknowledged once every holder has them)");
ABSL_FLAG(bool, balance_primaries, true,
          "hand ranges to in-sync backups so that each server is primary of "
          "as many ranges as the others (after a failover and a server's "
          "return, the survivor would stay primary of everything)");
ABSL_FLAG(int32_t, min_servers, 1,
          "table declarations wait until this many servers are alive");
ABSL_FLAG(int32_t, ranges_per_table, 0,
          "a new table gets at least this many key ranges (else one per "
          "live server), so that servers added later can take some");
ABSL_FLAG(bool, rebalance, true,
          "move key ranges to servers that join, and between servers, until "
          "each holds as many table bytes as the others (off: ranges move "
          "only off drained servers)");
ABSL_FLAG(int32_t, max_range_moves, 2,
          "key ranges being moved at once (scale out, drains)");
ABSL_FLAG(int32_t, handover_timeout_ms, 2000,
          "how long a range's primary may take to hand the range over (a "
          "move, a primary balance) or to report it quiet for a split; the "
          "range refuses writes meanwhile (clients retry), and past this the "
          "change is called off");
ABSL_FLAG(std::string, balance, "bytes",
          "what --rebalance evens out: bytes (the table memory each server "
          "holds) or load (each range's requests and rows per second as its "
          "primary measures them: hot ranges move to the least busy "
          "servers)");
ABSL_FLAG(bool, split_hot_ranges, true,
          "with --balance=load: split a key range too hot to move whole at "
          "the median of its traffic, while the busiest server's load is "
          "more than 1.3 times the mean (psctl split splits by hand)");
ABSL_FLAG(bool, merge_cold_ranges, true,
          "with --balance=load: merge neighbouring key ranges on the same "
          "servers whose load together is at most a quarter of a range's "
          "mean (psctl merge merges by hand)");
ABSL_FLAG(int64_t, merge_min_age_s, 600,
          "merge away only boundaries between ranges at least this old (by "
          "this scheduler's clock): a write cut on a map without the "
          "boundary may be retried until then, as long as the servers keep "
          "an idle client's ledger (docs/ARCHITECTURE.md \"Merging ranges\")");
ABSL_FLAG(std::string, consistency, "bsp", "bsp, ssp or asp");
ABSL_FLAG(int64_t, staleness, 0, "SSP's staleness bound");
ABSL_FLAG(int32_t, num_workers, 1, "workers whose updates count each step");
ABSL_FLAG(int32_t, backup_workers, 0,
          "extra workers; each step uses the first num_workers to finish");
ABSL_FLAG(int32_t, elastic_workers, 0,
          "seats for workers that join the running job (ssp and asp only): "
          "a worker registering when every rank is held takes the next seat "
          "and starts at the gating clock");
ABSL_FLAG(std::string, state_dir, "",
          "keep the scheduler's state (nodes, tables, map, ranks, ids, "
          "checkpoint manifests) in RocksDB here and recover it on restart; "
          "empty: in memory only (a restart forgets everything and may reuse "
          "ids). Needed for checkpoints");
ABSL_FLAG(int64_t, checkpoint_every_clocks, 0,
          "take a checkpoint every N clocks of the job (0: off)");
ABSL_FLAG(int64_t, checkpoint_every_s, 0,
          "take a checkpoint every S seconds (0: off)");
ABSL_FLAG(int64_t, checkpoint_timeout_s, 60,
          "how long one checkpoint may take");
ABSL_FLAG(int32_t, keep_checkpoints, 2, "complete checkpoints kept");
ABSL_FLAG(int64_t, shutdown_checkpoint_timeout_s, 20,
          "on SIGTERM (with --state_dir): take a last checkpoint, waiting at "
          "most this long, then stop (0: none)");

ABSL_FLAG(int64_t, worker_replace_timeout_ms, 60000,
          "how long the job waits for a replacement of a lost worker (one "
          "that died or left before finishing, beyond the backup workers) "
          "before --on_worker_loss applies");
ABSL_FLAG(std::string, on_worker_loss, "stop",
          "after --worker_replace_timeout_ms without a replacement: stop "
          "(the job fails, naming the lost worker) or continue (the job goes "
          "on with fewer workers; under BSP each step then averages the "
          "gradients of the workers left)");
ABSL_FLAG(std::string, job_token_file, "",
          "if set, only workers presenting this file's token (ps_worker "
          "--job_token_file) get a rank");
ABSL_FLAG(int64_t, clock_report_slack, 0,
          "worker clocks tolerated beyond the policy's bound (0: no worker "
          "more than s + 1 ahead of the slowest; reports that lag are "
          "waited for, --clock_report_grace_ms)");
ABSL_FLAG(int64_t, clock_report_grace_ms, 5000,
          "a worker clock beyond what the policy allows waits this long for "
          "the other workers' reports before it is refused");
ABSL_FLAG(int64_t, forget_dead_after_ms, 600000,
          "a dead node that no key range names is forgotten after this long");
ABSL_FLAG(int32_t, max_nodes, 4096,
          "most nodes the cluster map lists (alive and dead)");
ABSL_FLAG(int64_t, max_map_bytes, 1 << 20,
          "most bytes the cluster map may take (gRPC's limit is 4 MiB)");

int main(int argc, char** argv) {
  downpour::ProgramStart start;
  start.usage =
      "the Downpour scheduler: membership, the cluster map, the job's clocks "
      "(usage: ps_scheduler --listen=HOST:PORT --num_workers=N [flags])";
  start.log_tag = "scheduler";
  start.block_termination_signals = true;
  if (!downpour::StartProgram(argc, argv, start).ok()) return 2;

  downpour::SchedulerOptions options;
  options.listen_address = absl::GetFlag(FLAGS_listen);
  options.heartbeat_interval =
      absl::Milliseconds(absl::GetFlag(FLAGS_heartbeat_interval_ms));
  options.dead_after = absl::Milliseconds(absl::GetFlag(FLAGS_dead_after_ms));
  options.min_servers = absl::GetFlag(FLAGS_min_servers);
  options.suspect_grace =
      absl::Milliseconds(absl::GetFlag(FLAGS_suspect_grace_ms));
  options.replicas = absl::GetFlag(FLAGS_replicas);
  options.balance_primaries = absl::GetFlag(FLAGS_balance_primaries);
  options.ranges_per_table = absl::GetFlag(FLAGS_ranges_per_table);
  options.rebalance = absl::GetFlag(FLAGS_rebalance);
  options.max_range_moves = absl::GetFlag(FLAGS_max_range_moves);
  const int32_t handover_ms = absl::GetFlag(FLAGS_handover_timeout_ms);
  if (handover_ms < 100 || handover_ms > 600000) {
    DP_LOG(ERROR) << "--handover_timeout_ms=" << handover_ms
                  << ": must be in [100, 600000]";
    return 2;
  }
  options.handover_timeout = absl::Milliseconds(handover_ms);
  const std::string balance = absl::GetFlag(FLAGS_balance);
  if (balance != "bytes" && balance != "load") {
    DP_LOG(ERROR) << "--balance=" << balance << ": bytes or load";
    return 2;
  }
  options.balance_load = balance == "load";
  options.split_hot_ranges = absl::GetFlag(FLAGS_split_hot_ranges);
  options.merge_cold_ranges = absl::GetFlag(FLAGS_merge_cold_ranges);
  const int64_t merge_min_age_s = absl::GetFlag(FLAGS_merge_min_age_s);
  if (merge_min_age_s < 0 || merge_min_age_s > 86400 * 365) {
    DP_LOG(ERROR) << "--merge_min_age_s=" << merge_min_age_s
                  << ": must be in [0, 31536000]";
    return 2;
  }
  options.merge_min_age = absl::Seconds(merge_min_age_s);
  if (options.ranges_per_table < 0 || options.ranges_per_table > 4096) {
    DP_LOG(ERROR) << "--ranges_per_table=" << options.ranges_per_table
                  << ": must be in [0, 4096]";
    return 2;
  }
  if (options.max_range_moves < 1 || options.max_range_moves > 64) {
    DP_LOG(ERROR) << "--max_range_moves=" << options.max_range_moves
                  << ": must be in [1, 64]";
    return 2;
  }
  if (options.replicas < 1 || options.replicas > 16) {
    DP_LOG(ERROR) << "--replicas=" << options.replicas
                  << ": must be in [1, 16]";
    return 2;
  }
  auto policy = downpour::ConsistencyPolicy::Parse(
      absl::GetFlag(FLAGS_consistency), absl::GetFlag(FLAGS_staleness),
      absl::GetFlag(FLAGS_num_workers), absl::GetFlag(FLAGS_backup_workers),
      absl::GetFlag(FLAGS_elastic_workers));
  if (!policy.ok()) {
    DP_LOG(ERROR) << policy.status();
    return 2;
  }
  options.policy = *policy;
  options.worker_loss.replace_timeout =
      absl::Milliseconds(absl::GetFlag(FLAGS_worker_replace_timeout_ms));
  auto on_loss = downpour::WorkerLossOptions::ParseOnLoss(
      absl::GetFlag(FLAGS_on_worker_loss));
  if (!on_loss.ok()) {
    DP_LOG(ERROR) << on_loss.status();
    return 2;
  }
  options.worker_loss.on_loss = *on_loss;
  if (const std::string path = absl::GetFlag(FLAGS_job_token_file);
      !path.empty()) {
    auto token = downpour::ReadTokenFile(path);
    if (!token.ok()) {
      DP_LOG(ERROR) << "--job_token_file: " << token.status();
      return 2;
    }
    options.job_token = *token;
  }
  options.clock_report_slack =
      std::max<int64_t>(0, absl::GetFlag(FLAGS_clock_report_slack));
  options.clock_report_grace =
      absl::Milliseconds(absl::GetFlag(FLAGS_clock_report_grace_ms));
  options.forget_dead_after =
      absl::Milliseconds(absl::GetFlag(FLAGS_forget_dead_after_ms));
  options.max_nodes = absl::GetFlag(FLAGS_max_nodes);
  options.max_map_bytes =
      static_cast<size_t>(absl::GetFlag(FLAGS_max_map_bytes));
  if (options.max_nodes < 1 || options.max_map_bytes < (64u << 10) ||
      options.max_map_bytes > (3u << 20)) {
    DP_LOG(ERROR) << "--max_nodes must be >= 1 and --max_map_bytes in "
                  << "[64 KiB, 3 MiB] (gRPC's message limit is 4 MiB)";
    return 2;
  }
  auto auth = downpour::ClusterAuth::FromFlags(downpour::kGrpcServer);
  if (!auth.ok()) {
    DP_LOG(ERROR) << auth.status();
    return 2;
  }
  options.auth = *auth;
  options.state_dir = absl::GetFlag(FLAGS_state_dir);
  options.checkpoint_every_clocks =
      absl::GetFlag(FLAGS_checkpoint_every_clocks);
  options.checkpoint_every =
      absl::Seconds(absl::GetFlag(FLAGS_checkpoint_every_s));
  options.checkpoint_timeout =
      absl::Seconds(absl::GetFlag(FLAGS_checkpoint_timeout_s));
  options.keep_checkpoints = absl::GetFlag(FLAGS_keep_checkpoints);
  if (options.state_dir.empty() &&
      (options.checkpoint_every_clocks > 0 ||
       options.checkpoint_every > absl::ZeroDuration())) {
    DP_LOG(ERROR) << "--checkpoint_every_clocks and --checkpoint_every_s "
                     "need --state_dir";
    return 2;
  }
  const absl::Duration last_checkpoint =
      options.state_dir.empty()
          ? absl::ZeroDuration()
          : absl::Seconds(absl::GetFlag(FLAGS_shutdown_checkpoint_timeout_s));
  downpour::MetricsRegistry metrics;
  auto endpoint = downpour::StartMetricsFromFlags(&metrics);
  if (!endpoint.ok()) {
    DP_LOG(ERROR) << endpoint.status();
    return 2;
  }
  if (*endpoint != nullptr) options.metrics = &metrics;
  DP_LOG(INFO) << "job: " << policy->ToString();
  auto scheduler = downpour::Scheduler::Create(options);
  if (!scheduler.ok()) {
    DP_LOG(ERROR) << "cannot start: " << scheduler.status();
    return 1;
  }
  const std::string file = absl::GetFlag(FLAGS_address_file);
  if (!file.empty()) {
    if (absl::Status s =
            downpour::WriteAddressFile(file, (*scheduler)->address());
        !s.ok()) {
      DP_LOG(ERROR) << s;
      return 1;
    }
  }
  DP_LOG(INFO) << "serving on " << (*scheduler)->address() << " (listen "
               << options.listen_address << ")";
  downpour::TerminationHandler on_signal =
      downpour::OnTerminationSignal([s = scheduler->get(), last_checkpoint] {
        // The servers stopping with it must not be drained meanwhile.
        s->StopMoving();
        if (last_checkpoint > absl::ZeroDuration()) {
          // Kubernetes stops every pod of the job at once: the servers wait
          // (bounded) for this checkpoint before they exit; the workers finish
          // their step first (docs/OPERATIONS.md, "Stopping a job").
          DP_LOG(INFO) << "SIGTERM: a last checkpoint before stopping";
          auto m =
              s->Checkpoint(last_checkpoint, downpour::proto::LbfgsState());
          if (m.ok()) {
            DP_LOG(INFO) << "last checkpoint " << m->id() << " at clock "
                         << m->clock();
          } else {
            DP_LOG(WARNING) << "no last checkpoint: " << m.status();
          }
        }
        s->Shutdown();
      });
  (*scheduler)->Wait();
  (*scheduler)->Shutdown();
  on_signal.Disarm();  // a checkpoint under way ends before the scheduler goes
  DP_LOG(INFO) << "stopped";
  return 0;
}
