#include "scheduler/job_metrics.h"

#include <algorithm>
#include <map>
#include <string>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "scheduler/capacity.h"

namespace downpour {

int PrimaryRangesOf(const proto::ClusterMap& map, uint64_t node) {
  int n = 0;
  for (const auto& t : map.tables()) {
    for (const auto& r : t.ranges()) n += r.primary() == node && !r.lost();
  }
  return n;
}

int LostRanges(const proto::ClusterMap& map) {
  int n = 0;
  for (const auto& t : map.tables()) {
    for (const auto& r : t.ranges()) n += r.lost();
  }
  return n;
}

void WriteSchedulerMetrics(const proto::ClusterMap& map,
                           const proto::JobStatus& job,
                           const SchedulerEvents& events, MetricWriter* w) {
  w->Gauge("downpour_cluster_epoch", "Current cluster-map epoch", {},
           static_cast<double>(map.epoch()));
  // Every (role, state) pair, zeros included, so that alerts on "dead > 0"
  // see a series from the start. Label values are lower case, as
  // Prometheus' conventions have them.
  std::map<std::pair<std::string, std::string>, int> nodes;
  for (const char* role : {"server", "worker", "client"}) {
    for (const char* state : {"alive", "dead"}) nodes[{role, state}] = 0;
  }
  std::map<uint64_t, bool> alive;
  for (const proto::NodeInfo& n : map.nodes()) {
    ++nodes[{absl::AsciiStrToLower(proto::NodeRole_Name(n.role())),
             absl::AsciiStrToLower(proto::NodeState_Name(n.state()))}];
    alive[n.id()] = n.state() == proto::ALIVE;
  }
  // Each live server's table memory: what its ranges commit (the dense
  // arrays, scheduler/capacity.h) against what it said it can hold
  // (ps_server --max_table_bytes), for an alert before tables are refused.
  const absl::flat_hash_map<NodeId, uint64_t> committed = CommittedBytes(map);
  for (const proto::NodeInfo& n : map.nodes()) {
    if (n.role() != proto::SERVER || n.state() != proto::ALIVE ||
        n.memory_limit_bytes() == 0) {
      continue;
    }
    const MetricLabels l = {{"server", n.name()}};
    const auto it = committed.find(n.id());
    w->Gauge("downpour_server_table_memory_committed_bytes",
             "Table memory the server's ranges commit (dense arrays; sparse "
             "rows are not counted)",
             l, it == committed.end() ? 0 : static_cast<double>(it->second));
    w->Gauge("downpour_server_table_memory_limit_bytes",
             "Table memory the server can hold (--max_table_bytes)", l,
             static_cast<double>(n.memory_limit_bytes()));
  }
  for (const auto& [key, count] : nodes) {
    w->Gauge("downpour_cluster_nodes", "Registered nodes by role and state",
             {{"role", key.first}, {"state", key.second}}, count);
  }
  w->Gauge("downpour_cluster_tables", "Declared tables", {}, map.tables_size());
  for (const proto::TableMap& t : map.tables()) {
    int ranges = 0, lost = 0, unavailable = 0, under = 0, catching_up = 0;
    int replicas = 0;
    for (const proto::RangeAssignment& r : t.ranges()) {
      ++ranges;
      lost += r.lost();
      unavailable += !r.lost() && !alive[r.primary()];
      replicas += r.replicas_size();
      catching_up += r.catching_up_size();
      under += r.catching_up_size() > 0;
    }
    const MetricLabels l = {{"table", t.spec().name()}};
    w->Gauge("downpour_table_ranges", "Key ranges of the table", l, ranges);
    w->Gauge("downpour_table_ranges_lost",
             "Ranges whose data no live server holds (DATA_LOSS until "
             "restored)",
             l, lost);
    w->Gauge("downpour_table_ranges_unavailable",
             "Ranges whose primary is dead and that no backup could take over",
             l, unavailable);
    w->Gauge("downpour_table_ranges_catching_up",
             "Ranges with a backup still being copied to", l, under);
    w->Gauge("downpour_table_backups", "In-sync backups over all ranges", l,
             replicas);
    w->Gauge("downpour_table_backups_catching_up",
             "Backups being copied to, over all ranges", l, catching_up);
  }
  w->Counter("downpour_cluster_nodes_declared_dead_total",
             "Nodes declared dead (missed heartbeats, unreachable, replaced)",
             {{"role", "server"}},
             static_cast<double>(events.servers_declared_dead));
  w->Counter("downpour_cluster_nodes_declared_dead_total",
             "Nodes declared dead (missed heartbeats, unreachable, replaced)",
             {{"role", "worker"}},
             static_cast<double>(events.workers_declared_dead));
  w->Counter("downpour_cluster_promotions_total",
             "Failovers: ranges whose primary died and a backup took over", {},
             static_cast<double>(events.promotions));
  w->Counter("downpour_cluster_ranges_lost_total",
             "Ranges marked lost (their only holder restarted empty)", {},
             static_cast<double>(events.ranges_lost));
  int moving = 0, splitting = 0, merging = 0, draining = 0;
  for (const proto::TableMap& t : map.tables()) {
    for (const proto::RangeAssignment& r : t.ranges()) {
      moving += r.move_to() != 0;
      splitting += r.split_at() != 0;
      merging += r.merge() == proto::RangeAssignment::MERGE_WITH_NEXT;
    }
  }
  for (const proto::NodeInfo& n : map.nodes()) {
    draining += n.state() == proto::ALIVE && n.draining();
  }
  w->Gauge("downpour_cluster_range_moves",
           "Ranges being moved now (scale out, drains)", {}, moving);
  w->Gauge("downpour_cluster_servers_draining",
           "Servers being drained (psctl drain, --drain_on_sigterm)", {},
           draining);
  w->Counter("downpour_cluster_range_moves_started_total",
             "Range moves started (scale out, drains)", {},
             static_cast<double>(events.moves_started));
  w->Counter("downpour_cluster_range_moves_ended_total",
             "Range moves ended (completed or cancelled)", {},
             static_cast<double>(events.moves_done));
  w->Gauge("downpour_cluster_range_splits",
           "Ranges being split now (psctl split, --balance=load)", {},
           splitting);
  w->Counter("downpour_cluster_range_splits_started_total",
             "Range splits started", {},
             static_cast<double>(events.splits_started));
  w->Counter("downpour_cluster_range_splits_done_total",
             "Range splits completed (not those called off)", {},
             static_cast<double>(events.splits_done));
  w->Gauge("downpour_cluster_range_merges",
           "Pairs of neighbouring ranges being merged now (psctl merge, "
           "--balance=load)",
           {}, merging);
  w->Counter("downpour_cluster_range_merges_started_total",
             "Range merges started", {},
             static_cast<double>(events.merges_started));
  w->Counter("downpour_cluster_range_merges_done_total",
             "Range merges completed (not those called off)", {},
             static_cast<double>(events.merges_done));

  const proto::JobConfig& c = job.job();
  w->Gauge("downpour_job_info", "The job's consistency policy (value 1)",
           {{"consistency",
             absl::AsciiStrToLower(proto::Consistency_Name(c.consistency()))}},
           1);
  w->Gauge("downpour_job_workers", "N: workers whose updates count each step",
           {}, c.num_workers());
  w->Gauge("downpour_job_backup_workers", "Backup workers configured", {},
           c.backup_workers());
  w->Gauge("downpour_job_elastic_workers",
           "Elastic seats: workers that may join the running job", {},
           c.elastic_workers());
  const int started = static_cast<int>(c.num_workers() + c.backup_workers());
  w->Gauge("downpour_job_elastic_workers_joined",
           "Elastic seats taken by workers that joined the running job", {},
           std::max(0, job.workers_size() - started));
  w->Gauge("downpour_job_staleness_bound", "SSP's staleness bound", {},
           static_cast<double>(c.staleness()));
  w->Gauge("downpour_job_gating_clock",
           "Clock every worker may start (the slowest counted worker's)", {},
           static_cast<double>(job.gating_clock()));
  int backup_ranks_running = 0;
  for (const proto::WorkerStatus& s : job.workers()) {
    const MetricLabels l = {{"rank", absl::StrCat(s.rank())}};
    w->Gauge("downpour_worker_clock", "Iterations the worker has completed", l,
             static_cast<double>(s.clock()));
    w->Gauge("downpour_worker_loss", "Training loss the worker last reported",
             l, s.loss());
    w->Counter("downpour_worker_examples_total",
               "Training examples the worker has processed", l,
               static_cast<double>(s.examples()));
    w->Gauge("downpour_worker_max_staleness",
             "Largest staleness (clocks) the worker's pulls have seen", l,
             static_cast<double>(s.max_staleness()));
    w->Counter("downpour_worker_discarded_pushes_total",
               "The worker's pushes dropped as late (backup workers)", l,
               static_cast<double>(s.discarded()));
    // Every state, 1 for the rank's current one: an alert on a lost or
    // retired rank needs the series to exist while it is 0.
    const char* state = s.retired()    ? "retired"
                        : s.lost()     ? "lost"
                        : s.finished() ? "finished"
                                       : "running";
    for (const char* name : {"running", "finished", "lost", "retired"}) {
      w->Gauge("downpour_worker_state",
               "The rank's state: running, finished, lost (waiting for a "
               "replacement) or retired (the job went on without it)",
               {{"rank", absl::StrCat(s.rank())}, {"state", name}},
               std::string(name) == state ? 1 : 0);
    }
    if (s.test_accuracy() > 0) {
      w->Gauge("downpour_worker_test_accuracy",
               "Test accuracy the worker last evaluated", l, s.test_accuracy());
    }
    if (s.rank() >= static_cast<int>(c.num_workers()) && s.rank() < started &&
        s.clock() > 0) {
      ++backup_ranks_running;
    }
  }
  w->Gauge("downpour_job_backup_workers_active",
           "Backup-worker ranks that have completed at least one step", {},
           backup_ranks_running);
}

}  // namespace downpour
