#include "server/stats_metrics.h"

#include <map>
#include <string>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"

namespace downpour {
namespace {

// Lower case, as Prometheus' conventions have label values: push, pull,
// push_pull, ..., replication.
std::string OpName(uint32_t op) {
  if (op == kReplicationOp) return "replication";
  if (proto::Op_IsValid(static_cast<int>(op))) {
    return absl::AsciiStrToLower(proto::Op_Name(static_cast<proto::Op>(op)));
  }
  return absl::StrCat("op ", op);
}

}  // namespace

void WriteServerMetrics(bool ready, const proto::ServerStats& stats,
                        const std::vector<RequestStats::Cell>& requests,
                        MetricWriter* w) {
  w->Gauge("downpour_server_ready",
           "1 once the server has registered and serves its key ranges", {},
           ready ? 1 : 0);
  if (!ready) return;
  w->Gauge("downpour_server_epoch", "Cluster-map epoch the server has applied",
           {}, static_cast<double>(stats.epoch()));

  absl::flat_hash_map<uint32_t, std::string> names;
  for (const proto::TableStats& t : stats.tables()) names[t.id()] = t.name();
  // Cells of unknown tables (requests for a table this server does not
  // know) may share a label set: sum them.
  std::map<std::pair<std::string, std::string>, RequestStats::Cell> merged;
  for (const RequestStats::Cell& c : requests) {
    std::string op = c.overflow ? "other" : OpName(c.op);
    std::string table;
    if (c.overflow) {
      table = "other";
    } else if (c.op == kReplicationOp || c.table == 0) {
      table = "";
    } else if (auto it = names.find(c.table); it != names.end()) {
      table = it->second;
    } else {
      table = absl::StrCat("id ", c.table);
    }
    auto [it, inserted] = merged.try_emplace({op, table}, c);
    if (inserted) continue;
    RequestStats::Cell& m = it->second;
    m.requests += c.requests;
    m.errors += c.errors;
    m.latency.count += c.latency.count;
    m.latency.sum += c.latency.sum;
    for (size_t i = 0; i < m.latency.counts.size(); ++i) {
      m.latency.counts[i] += c.latency.counts[i];
    }
  }
  for (auto& [key, c] : merged) {
    const MetricLabels labels = {{"op", key.first}, {"table", key.second}};
    w->Counter("downpour_server_requests_total",
               "Data-plane requests handled, by operation and table", labels,
               static_cast<double>(c.requests));
    w->Counter("downpour_server_request_errors_total",
               "Data-plane requests answered with an error", labels,
               static_cast<double>(c.errors));
    w->Histogram("downpour_server_request_duration_seconds",
                 "Time the data thread spent on a request, from receipt to "
                 "its reply or its deferral (a deferred reply waits longer)",
                 labels, std::move(c.latency));
  }
  w->Counter("downpour_server_request_failures_total",
             "Requests refused before or while executing (bad framing, "
             "validation errors, replication refusals)",
             {}, static_cast<double>(stats.errors()));
  w->Counter("downpour_server_received_bytes_total",
             "Data-plane bytes received (frames of every request)", {},
             static_cast<double>(stats.bytes_in()));
  w->Counter("downpour_server_sent_bytes_total",
             "Data-plane bytes sent (frames of every reply)", {},
             static_cast<double>(stats.bytes_out()));
  w->Counter("downpour_server_auth_failures_total",
             "Data-plane connections refused in the security handshake", {},
             static_cast<double>(stats.auth_failures()));
  w->Gauge("downpour_server_deferred_replies",
           "Replies waiting: BSP requests held for their step and writes "
           "held for their backups",
           {}, static_cast<double>(stats.deferred_replies()));
  w->Gauge("downpour_server_replication_held_writes",
           "Writes applied here and held until every backup acknowledged them",
           {}, static_cast<double>(stats.held_writes()));
  w->Gauge("downpour_server_data_thread_queue",
           "Work handed to the data thread whose time has come and that has "
           "not run yet",
           {}, static_cast<double>(stats.data_thread_queue()));
  w->Counter("downpour_server_replication_forwarded_total",
             "Writes forwarded to the backups of ranges this server is "
             "primary of",
             {}, static_cast<double>(stats.replication_forwarded()));
  w->Counter("downpour_server_replication_resent_total",
             "Replication messages sent again to a backup", {},
             static_cast<double>(stats.replication_resent()));
  w->Counter("downpour_server_replication_copies_total",
             "Catch-up copies of a range to a new backup, finished", {},
             static_cast<double>(stats.replication_copies()));
  w->Counter("downpour_server_replication_rows_copied_total",
             "Rows sent in catch-up copies", {},
             static_cast<double>(stats.replication_rows_copied()));
  w->Counter("downpour_server_replica_messages_applied_total",
             "Replication messages applied as a backup", {},
             static_cast<double>(stats.replica_messages_applied()));
  w->Counter("downpour_server_retries_answered_total",
             "Client retries of writes already applied, answered without "
             "applying them again",
             {}, static_cast<double>(stats.retries_answered()));

  // Each range served as primary: its load (rates in PromQL) and size,
  // labelled by its first key (ranges move between servers as a whole).
  for (const proto::RangeLoad& r : stats.ranges()) {
    auto name = names.find(r.table_id());
    const MetricLabels l = {
        {"table", name != names.end() ? name->second
                                      : absl::StrCat("id ", r.table_id())},
        {"range", absl::StrCat(r.begin())}};
    w->Counter("downpour_range_requests_total",
               "Client requests a range served here as primary", l,
               static_cast<double>(r.requests()));
    w->Counter("downpour_range_keys_total",
               "Rows the client requests to a range read or wrote", l,
               static_cast<double>(r.keys()));
    w->Gauge("downpour_range_bytes",
             "Bytes a range holds (values, handler state, vectors)", l,
             static_cast<double>(r.bytes()));
  }
  for (const proto::TableStats& t : stats.tables()) {
    const MetricLabels l = {{"table", t.name()}};
    w->Gauge("downpour_table_rows", "Rows held by this server", l,
             static_cast<double>(t.rows()));
    w->Gauge("downpour_table_value_bytes", "Bytes of parameter values held", l,
             static_cast<double>(t.value_bytes()));
    w->Gauge("downpour_table_state_bytes",
             "Bytes of update-handler state held (momentum, Adagrad, ...)", l,
             static_cast<double>(t.state_bytes()));
    w->Gauge("downpour_table_allocated_bytes",
             "Bytes the table's storage holds, capacity included", l,
             static_cast<double>(t.allocated_bytes()));
    w->Gauge("downpour_table_max_staleness",
             "Largest staleness (clocks) a tracked pull has seen", l,
             static_cast<double>(t.max_staleness()));
    w->Counter("downpour_table_tracked_pulls_total",
               "Pulls that carried a worker clock", l,
               static_cast<double>(t.tracked_pulls()));
    w->Counter("downpour_table_discarded_pushes_total",
               "Late pushes dropped for a clock already applied (backup "
               "workers)",
               l, static_cast<double>(t.discarded_pushes()));
    w->Counter("downpour_table_aggregated_steps_total",
               "BSP steps applied (per pushed part)", l,
               static_cast<double>(t.aggregated_steps()));
    w->Counter("downpour_table_dropped_task_adds_total",
               "Late or repeated Sandblaster task adds dropped (backup tasks)",
               l, static_cast<double>(t.dropped_task_adds()));
    w->Counter("downpour_table_zero_copy_replies_total",
               "Range reads sent from the table without copying", l,
               static_cast<double>(t.zero_copy_replies()));
    w->Counter("downpour_table_pin_waits_total",
               "Writes that waited for a zero-copy reply to be sent", l,
               static_cast<double>(t.pin_waits()));
    w->Counter("downpour_table_pin_copies_total",
               "Writes that copied a range because a reply stayed unsent", l,
               static_cast<double>(t.pin_copies()));
    w->Gauge("downpour_table_pinned_replies", "Zero-copy replies not yet sent",
             l, static_cast<double>(t.pinned_replies()));
    // Bounded sparse tables (TableSpec.bounds).
    w->Gauge("downpour_table_row_cap",
             "Rows this server may hold in memory for the table (the caps of "
             "the ranges it holds; 0: no cap)",
             l, static_cast<double>(t.row_cap()));
    w->Counter("downpour_table_evicted_rows_total",
               "Rows that left memory to make room (to the cold tier, or "
               "dropped)",
               l, static_cast<double>(t.evicted_rows()));
    w->Counter("downpour_table_expired_rows_total",
               "Rows that left memory idle for the table's TTL", l,
               static_cast<double>(t.expired_rows()));
    w->Counter("downpour_table_admitted_rows_total",
               "Rows created (for a table with admit_after > 1: ids that "
               "reached their push count)",
               l, static_cast<double>(t.admitted_rows()));
    w->Gauge("downpour_table_pending_ids",
             "Admission counters of ids without a row yet", l,
             static_cast<double>(t.pending_ids()));
    w->Gauge("downpour_table_cold_rows",
             "Rows in the cold tier (files under --data_dir/cold)", l,
             static_cast<double>(t.cold_rows()));
    w->Counter("downpour_table_refused_writes_total",
               "Writes refused at the table's cap (no eviction, or too many "
               "rows pinned)",
               l, static_cast<double>(t.refused_writes()));
  }
}

}  // namespace downpour
