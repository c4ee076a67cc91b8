#include "psctl/cluster_status.h"

#include <algorithm>
#include <map>
#include <memory>
#include <vector>

#include "absl/algorithm/container.h"
#include "absl/container/flat_hash_map.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "cluster/scheduler_client.h"
#include "common/grpc_channel.h"
#include "common/grpc_status.h"
#include "common/status_macros.h"
#include "consistency/consistency.h"
#include "grpcpp/grpcpp.h"
#include "proto/downpour.grpc.pb.h"
#include "proto/health.grpc.pb.h"

namespace downpour {
namespace {

std::string Health(const std::string& address, const ClusterAuth& auth,
                   absl::Duration timeout) {
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + timeout));
  grpc::health::v1::HealthCheckRequest req;
  grpc::health::v1::HealthCheckResponse resp;
  const grpc::Status s =
      grpc::health::v1::Health::NewStub(NewGrpcChannel(address, auth))
          ->Check(&ctx, req, &resp);
  if (!s.ok()) return "UNREACHABLE";
  return resp.status() == grpc::health::v1::HealthCheckResponse::SERVING
             ? "SERVING"
             : "NOT_SERVING";
}

absl::StatusOr<proto::ServerStats> GetStats(const std::string& address,
                                            const ClusterAuth& auth,
                                            absl::Duration timeout) {
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + timeout));
  proto::ServerStats stats;
  const grpc::Status s =
      proto::ServerAdmin::NewStub(NewGrpcChannel(address, auth))
          ->GetStats(&ctx, proto::StatsRequest(), &stats);
  if (!s.ok()) {
    return FromGrpcStatus(s, absl::StrCat("stats of the server at ", address));
  }
  return stats;
}

uint64_t Op(const proto::ServerStats& s, const char* op) {
  auto it = s.requests_by_op().find(op);
  return it == s.requests_by_op().end() ? 0 : it->second;
}

uint64_t AllOps(const proto::ServerStats& s) {
  uint64_t n = 0;
  for (const auto& [op, count] : s.requests_by_op()) n += count;
  return n;
}

double Rate(uint64_t before, uint64_t after, double seconds) {
  if (seconds <= 0 || after < before) return 0;
  return static_cast<double>(after - before) / seconds;
}

std::string Human(double v) {
  if (v >= 1e9) return absl::StrFormat("%.1fG", v / 1e9);
  if (v >= 1e6) return absl::StrFormat("%.1fM", v / 1e6);
  if (v >= 1e4) return absl::StrFormat("%.1fk", v / 1e3);
  return absl::StrFormat("%.0f", v);
}

std::string Ids(const google::protobuf::RepeatedField<uint64_t>& ids) {
  if (ids.empty()) return "-";
  return absl::StrJoin(ids, ",");
}

}  // namespace

absl::StatusOr<psctl::ClusterStatus> GatherStatus(
    const StatusOptions& options) {
  SchedulerClient scheduler(options.scheduler_address, options.rpc_timeout,
                            options.auth);
  psctl::ClusterStatus out;
  out.set_scheduler(options.scheduler_address);
  DP_ASSIGN_OR_RETURN(*out.mutable_map(), scheduler.GetClusterMap(),
                      "psctl: the scheduler at ", options.scheduler_address);
  DP_ASSIGN_OR_RETURN(*out.mutable_job(), scheduler.GetJobStatus(),
                      "psctl: the scheduler at ", options.scheduler_address);
  out.set_scheduler_health(
      Health(options.scheduler_address, options.auth, options.rpc_timeout));

  // First sample; the second after the interval.
  std::vector<const proto::NodeInfo*> servers;
  for (const proto::NodeInfo& n : out.map().nodes()) {
    if (n.role() == proto::SERVER) servers.push_back(&n);
  }
  std::vector<absl::StatusOr<proto::ServerStats>> first;
  const absl::Time t0 = absl::Now();
  if (options.interval > absl::ZeroDuration()) {
    for (const proto::NodeInfo* n : servers) {
      first.push_back(
          n->state() == proto::ALIVE
              ? GetStats(n->admin_address(), options.auth, options.rpc_timeout)
              : absl::UnavailableError("declared dead"));
    }
    absl::SleepFor(options.interval - (absl::Now() - t0));
  }
  const double seconds = options.interval > absl::ZeroDuration()
                             ? absl::ToDoubleSeconds(absl::Now() - t0)
                             : 0;
  out.set_interval_seconds(seconds);
  absl::flat_hash_map<std::string, psctl::TableSummary*> tables;
  for (const proto::TableMap& t : out.map().tables()) {
    psctl::TableSummary* s = out.add_tables();
    *s->mutable_spec() = t.spec();
    tables[t.spec().name()] = s;
    // The policy the table enforces: its own, or the job's
    // (ConsistencyPolicy::ForTable reads the same fields).
    s->set_policy("none");
    if (t.spec().follows_job()) {
      absl::StatusOr<ConsistencyPolicy> job =
          ConsistencyPolicy::FromJob(out.job().job());
      if (job.ok()) {
        const ConsistencyPolicy p = job->ForTable(t.spec());
        s->set_policy(p.is_bsp()   ? "bsp"
                      : p.is_asp() ? "asp"
                                   : absl::StrCat("ssp:", p.staleness));
      } else {
        s->set_policy("job");
      }
    }
    absl::flat_hash_map<uint64_t, bool> alive;
    for (const proto::NodeInfo& n : out.map().nodes()) {
      alive[n.id()] = n.state() == proto::ALIVE;
    }
    for (const proto::RangeAssignment& r : t.ranges()) {
      s->set_ranges(s->ranges() + 1);
      s->set_ranges_lost(s->ranges_lost() + r.lost());
      s->set_ranges_catching_up(s->ranges_catching_up() +
                                (r.catching_up_size() > 0));
      s->set_ranges_unavailable(s->ranges_unavailable() +
                                (!r.lost() && !alive[r.primary()]));
      s->set_backups(s->backups() + r.replicas_size());
    }
  }
  // Each range's load as its primary reports it, in both samples.
  using RangeKey = std::pair<uint32_t, uint64_t>;
  absl::flat_hash_map<RangeKey, proto::RangeLoad> load_before, load_after;
  for (size_t i = 0; i < servers.size(); ++i) {
    const proto::NodeInfo& n = *servers[i];
    psctl::ServerStatus* s = out.add_servers();
    s->set_node_id(n.id());
    s->set_name(n.name());
    s->set_state(proto::NodeState_Name(n.state()));
    s->set_admin_address(n.admin_address());
    s->set_data_endpoint(n.data_endpoint());
    if (n.state() != proto::ALIVE) {
      s->set_health("UNREACHABLE");
      s->set_error("declared dead by the scheduler");
      continue;
    }
    s->set_health(Health(n.admin_address(), options.auth, options.rpc_timeout));
    absl::StatusOr<proto::ServerStats> stats =
        GetStats(n.admin_address(), options.auth, options.rpc_timeout);
    if (!stats.ok()) {
      s->set_error(std::string(stats.status().message()));
      continue;
    }
    *s->mutable_stats() = *stats;
    for (const proto::RangeLoad& l : stats->ranges()) {
      load_after[{l.table_id(), l.begin()}] = l;
    }
    if (i < first.size() && first[i].ok()) {
      const proto::ServerStats& a = *first[i];
      const proto::ServerStats& b = *stats;
      for (const proto::RangeLoad& l : a.ranges()) {
        load_before[{l.table_id(), l.begin()}] = l;
      }
      s->set_push_rate(Rate(Op(a, "PUSH") + Op(a, "PUSH_PULL"),
                            Op(b, "PUSH") + Op(b, "PUSH_PULL"), seconds));
      s->set_pull_rate(Rate(Op(a, "PULL") + Op(a, "PUSH_PULL"),
                            Op(b, "PULL") + Op(b, "PUSH_PULL"), seconds));
      s->set_request_rate(Rate(AllOps(a), AllOps(b), seconds));
      s->set_bytes_in_rate(Rate(a.bytes_in(), b.bytes_in(), seconds));
      s->set_bytes_out_rate(Rate(a.bytes_out(), b.bytes_out(), seconds));
    }
    for (const proto::TableStats& ts : stats->tables()) {
      auto it = tables.find(ts.name());
      if (it == tables.end()) continue;
      psctl::TableSummary* t = it->second;
      t->set_rows(t->rows() + ts.rows());
      t->set_value_bytes(t->value_bytes() + ts.value_bytes());
      t->set_state_bytes(t->state_bytes() + ts.state_bytes());
      t->set_max_staleness(std::max(t->max_staleness(), ts.max_staleness()));
      t->set_discarded_pushes(t->discarded_pushes() + ts.discarded_pushes());
      t->set_aggregated_steps(t->aggregated_steps() + ts.aggregated_steps());
      t->set_row_cap(t->row_cap() + ts.row_cap());
      t->set_evicted_rows(t->evicted_rows() + ts.evicted_rows());
      t->set_expired_rows(t->expired_rows() + ts.expired_rows());
      t->set_admitted_rows(t->admitted_rows() + ts.admitted_rows());
      t->set_pending_ids(t->pending_ids() + ts.pending_ids());
      t->set_cold_rows(t->cold_rows() + ts.cold_rows());
      t->set_refused_writes(t->refused_writes() + ts.refused_writes());
    }
  }
  for (const proto::TableMap& t : out.map().tables()) {
    for (const proto::RangeAssignment& r : t.ranges()) {
      psctl::RangeStatus* rs = out.add_ranges();
      rs->set_table(t.spec().name());
      rs->set_begin(r.begin());
      rs->set_end(r.end());
      rs->set_primary(r.primary());
      *rs->mutable_backups() = r.replicas();
      *rs->mutable_catching_up() = r.catching_up();
      rs->set_move_from(r.move_from());
      rs->set_move_to(r.move_to());
      rs->set_handing_to(r.handing_to());
      rs->set_lost(r.lost());
      rs->set_split_at(r.split_at());
      rs->set_merging_with_next(r.merge() ==
                                proto::RangeAssignment::MERGE_WITH_NEXT);
      rs->set_merging_with_previous(
          r.merge() == proto::RangeAssignment::MERGE_WITH_PREVIOUS);
      if (rs->merging_with_next()) {
        out.set_merges_under_way(out.merges_under_way() + 1);
      }
      if (r.move_to() != 0) out.set_moves_under_way(out.moves_under_way() + 1);
      if (r.split_at() != 0) {
        out.set_splits_under_way(out.splits_under_way() + 1);
      }
      const RangeKey key{t.spec().id(), r.begin()};
      auto after = load_after.find(key);
      if (after == load_after.end()) continue;
      rs->set_rows(after->second.rows());
      rs->set_bytes(after->second.bytes());
      auto before = load_before.find(key);
      if (before == load_before.end()) continue;
      rs->set_request_rate(
          Rate(before->second.requests(), after->second.requests(), seconds));
      rs->set_key_rate(
          Rate(before->second.keys(), after->second.keys(), seconds));
    }
  }
  return out;
}

std::string FormatRanges(const psctl::ClusterStatus& s) {
  std::vector<std::vector<std::string>> rows = {
      {"TABLE", "KEYS", "PRIMARY", "BACKUPS", "CATCHING_UP", "MOVE", "ROWS",
       "BYTES", "REQ/s", "KEYS/s"}};
  const bool rates = s.interval_seconds() > 0;
  for (const psctl::RangeStatus& r : s.ranges()) {
    std::string move = "-";
    if (r.move_to() != 0) {
      move = absl::StrCat(
          r.move_from(), "->", r.move_to(),
          r.handing_to() == r.move_to() ? " (handing over)"
          : std::find(r.catching_up().begin(), r.catching_up().end(),
                      r.move_to()) != r.catching_up().end()
              ? " (copying)"
              : "");
    }
    if (r.split_at() != 0) move = absl::StrCat("split at ", r.split_at());
    if (r.merging_with_next()) move = absl::StrCat("merge at ", r.end());
    if (r.merging_with_previous()) move = absl::StrCat("merge at ", r.begin());
    rows.push_back({r.table(), absl::StrCat("[", r.begin(), ", ", r.end(), ")"),
                    absl::StrCat(r.primary(), r.lost() ? " (lost)" : ""),
                    Ids(r.backups()), Ids(r.catching_up()), move,
                    absl::StrCat(r.rows()),
                    Human(static_cast<double>(r.bytes())),
                    rates ? Human(r.request_rate()) : "-",
                    rates ? Human(r.key_rate()) : "-"});
  }
  return TextTable(rows);
}

std::string TextTable(const std::vector<std::vector<std::string>>& rows) {
  std::vector<size_t> width;
  for (const auto& row : rows) {
    if (row.size() > width.size()) width.resize(row.size(), 0);
    for (size_t c = 0; c < row.size(); ++c) {
      width[c] = std::max(width[c], row[c].size());
    }
  }
  std::string out;
  for (const auto& row : rows) {
    std::string line;
    for (size_t c = 0; c < row.size(); ++c) {
      line += row[c];
      if (c + 1 < row.size())
        line += std::string(width[c] - row[c].size() + 2, ' ');
    }
    out += line + "\n";
  }
  return out;
}

std::string FormatStatus(const psctl::ClusterStatus& s, bool wide) {
  std::string out;
  const proto::JobConfig& job = s.job().job();
  absl::StrAppend(&out, "scheduler ", s.scheduler(), "  ", s.scheduler_health(),
                  "  epoch ", s.map().epoch(), "\n");
  absl::StrAppend(
      &out, "job ",
      absl::AsciiStrToLower(proto::Consistency_Name(job.consistency())));
  if (job.consistency() == proto::SSP)
    absl::StrAppend(&out, "(s=", job.staleness(), ")");
  absl::StrAppend(&out, "  workers ", job.num_workers(), " + ",
                  job.backup_workers(), " backup");
  if (job.elastic_workers() > 0) {
    // Seats taken: the ranks the job has beyond the ones it started with.
    const int started =
        static_cast<int>(job.num_workers() + job.backup_workers());
    absl::StrAppend(&out, " + ", job.elastic_workers(), " elastic (",
                    std::max(0, s.job().workers_size() - started), " joined)");
    // A BSP job counts each seat's pushes from the step it grew at.
    if (job.consistency() == proto::BSP && s.map().seat_clocks_size() > 0) {
      absl::StrAppend(&out, ", grew at step",
                      s.map().seat_clocks_size() > 1 ? "s " : " ",
                      absl::StrJoin(s.map().seat_clocks(), ", "));
    }
  }
  absl::StrAppend(&out, "  gating clock ", s.job().gating_clock(), "\n\n");

  const bool rates = s.interval_seconds() > 0;
  std::vector<std::vector<std::string>> nodes = {
      {"NODE", "ROLE", "NAME", "STATE", "HEALTH", "PUSH/s", "PULL/s", "IN B/s",
       "OUT B/s", "ADDRESS"}};
  if (wide) {
    nodes[0].insert(nodes[0].end(), {"REQ/s", "EPOCH", "DATA", "INCARNATION"});
  }
  absl::flat_hash_map<uint64_t, const psctl::ServerStatus*> by_id;
  for (const psctl::ServerStatus& srv : s.servers())
    by_id[srv.node_id()] = &srv;
  for (const proto::NodeInfo& n : s.map().nodes()) {
    std::vector<std::string> row = {
        absl::StrCat(n.id()), proto::NodeRole_Name(n.role()), n.name(),
        absl::StrCat(
            proto::NodeState_Name(n.state()),
            n.draining() && n.state() == proto::ALIVE ? ",DRAINING" : "")};
    auto it = by_id.find(n.id());
    if (it != by_id.end()) {
      const psctl::ServerStatus& srv = *it->second;
      row.push_back(srv.health());
      const bool have = rates && srv.error().empty();
      row.push_back(have ? Human(srv.push_rate()) : "-");
      row.push_back(have ? Human(srv.pull_rate()) : "-");
      row.push_back(have ? Human(srv.bytes_in_rate()) : "-");
      row.push_back(have ? Human(srv.bytes_out_rate()) : "-");
      row.push_back(n.admin_address());
      if (wide) {
        row.push_back(have ? Human(srv.request_rate()) : "-");
        row.push_back(srv.error().empty() ? absl::StrCat(srv.stats().epoch())
                                          : "-");
      }
    } else {
      row.insert(row.end(), {"-", "-", "-", "-", "-", "-"});
      if (wide) row.insert(row.end(), {"-", "-"});
    }
    if (wide) {
      row.push_back(n.data_endpoint().empty() ? "-" : n.data_endpoint());
      row.push_back(absl::StrCat(n.incarnation()));
    }
    nodes.push_back(std::move(row));
  }
  out += TextTable(nodes);

  std::vector<std::vector<std::string>> ranges = {
      {"TABLE", "KEYS", "PRIMARY", "BACKUPS", "CATCHING_UP", "FLAGS"}};
  absl::flat_hash_map<uint64_t, bool> alive;
  for (const proto::NodeInfo& n : s.map().nodes()) {
    alive[n.id()] = n.state() == proto::ALIVE;
  }
  for (const proto::TableMap& t : s.map().tables()) {
    for (const proto::RangeAssignment& r : t.ranges()) {
      std::vector<std::string> flags;
      if (r.lost()) flags.push_back("lost");
      if (!r.lost() && !alive[r.primary()]) flags.push_back("unavailable");
      if (r.catching_up_size() > 0) flags.push_back("catching_up");
      if (r.handing_to() != 0) {
        flags.push_back(absl::StrCat("handing_to=", r.handing_to()));
      }
      if (r.move_to() != 0) {
        flags.push_back(
            absl::StrCat("moving=", r.move_from(), "->", r.move_to()));
      }
      if (r.split_at() != 0) {
        flags.push_back(absl::StrCat("splitting_at=", r.split_at()));
      }
      if (r.merge() == proto::RangeAssignment::MERGE_WITH_NEXT) {
        flags.push_back(absl::StrCat("merging_at=", r.end()));
      }
      if (r.merge() == proto::RangeAssignment::MERGE_WITH_PREVIOUS) {
        flags.push_back(absl::StrCat("merging_at=", r.begin()));
      }
      ranges.push_back(
          {t.spec().name(), absl::StrCat("[", r.begin(), ", ", r.end(), ")"),
           absl::StrCat(r.primary()), Ids(r.replicas()), Ids(r.catching_up()),
           flags.empty() ? "ok" : absl::StrJoin(flags, ",")});
    }
  }
  if (ranges.size() > 1) out += "\n" + TextTable(ranges);
  // Elastic changes under way: drains and moves.
  std::vector<std::string> draining;
  for (const proto::NodeInfo& n : s.map().nodes()) {
    if (n.state() != proto::ALIVE || !n.draining()) continue;
    int held = 0;
    for (const proto::TableMap& t : s.map().tables()) {
      for (const proto::RangeAssignment& r : t.ranges()) {
        held += r.primary() == n.id() ||
                absl::c_linear_search(r.replicas(), n.id()) ||
                absl::c_linear_search(r.catching_up(), n.id());
      }
    }
    draining.push_back(absl::StrCat(n.name(), " (", held, " range(s) left)"));
  }
  if (s.moves_under_way() > 0 || !draining.empty()) {
    absl::StrAppend(
        &out, "\nmoves under way: ", s.moves_under_way(),
        draining.empty()
            ? std::string()
            : absl::StrCat("; draining: ", absl::StrJoin(draining, ", ")),
        "\n");
  }
  if (s.merges_under_way() > 0) {
    absl::StrAppend(&out, "merges under way: ", s.merges_under_way(), "\n");
  }
  if (s.splits_under_way() > 0) {
    absl::StrAppend(&out, "splits under way: ", s.splits_under_way(), "\n");
  }

  if (s.job().workers_size() > 0) {
    std::vector<std::vector<std::string>> workers = {
        {"RANK", "STATE", "CLOCK", "LOSS", "TEST_ACC", "STALENESS", "DISCARDED",
         "EXAMPLES"}};
    for (const proto::WorkerStatus& w : s.job().workers()) {
      workers.push_back(
          {absl::StrCat(w.rank()),
           w.retired()    ? "retired"
           : w.lost()     ? "lost"
           : w.finished() ? "finished"
                          : "running",
           absl::StrCat(w.clock()), absl::StrFormat("%.4f", w.loss()),
           w.test_accuracy() > 0 ? absl::StrFormat("%.4f", w.test_accuracy())
                                 : "-",
           absl::StrCat(w.max_staleness()), absl::StrCat(w.discarded()),
           absl::StrCat(w.examples())});
    }
    out += "\n" + TextTable(workers);
  }
  for (const psctl::ServerStatus& srv : s.servers()) {
    if (!srv.error().empty() && srv.state() == "ALIVE") {
      absl::StrAppend(&out, "\nserver ", srv.node_id(), " (", srv.name(),
                      "): ", srv.error(), "\n");
    }
  }
  return out;
}

namespace {
// A bounded sparse table's bounds in a few words: "cap 1000000 lru ttl 50c
// admit 3 cold"; "-" for others.
std::string BoundsText(const proto::TableSpec& spec) {
  if (!spec.has_bounds()) return "-";
  const proto::SparseBounds& b = spec.bounds();
  std::vector<std::string> parts;
  if (b.max_rows() > 0) parts.push_back(absl::StrCat("cap ", b.max_rows()));
  if (b.max_bytes() > 0) {
    parts.push_back(absl::StrCat("cap ", b.max_bytes(), "B"));
  }
  if (b.eviction() != proto::SparseBounds::EVICTION_NONE) {
    parts.push_back(absl::AsciiStrToLower(
        proto::SparseBounds::Eviction_Name(b.eviction())));
  }
  if (b.ttl_clocks() > 0)
    parts.push_back(absl::StrCat("ttl ", b.ttl_clocks(), "c"));
  if (b.ttl_seconds() > 0) {
    parts.push_back(absl::StrCat("ttl ", b.ttl_seconds(), "s"));
  }
  if (b.admit_after() > 1) {
    parts.push_back(absl::StrCat("admit ", b.admit_after()));
  }
  if (b.cold_tier()) parts.push_back("cold");
  return absl::StrJoin(parts, " ");
}
}  // namespace

std::string FormatTables(const psctl::ClusterStatus& s, bool wide) {
  std::vector<std::vector<std::string>> rows = {
      {"TABLE", "ID", "KIND", "WIDTH", "KEYS", "HANDLER", "POLICY", "SYNC",
       "RANGES", "BACKUPS", "ROWS", "BYTES", "STALENESS", "DISCARDED", "BOUNDS",
       "FLAGS"}};
  if (wide) {
    rows[0].insert(rows[0].end(),
                   {"VALUE_BYTES", "STATE_BYTES", "INIT", "AGGREGATED_STEPS",
                    "ROW_CAP", "EVICTED", "EXPIRED", "ADMITTED", "PENDING_IDS",
                    "COLD_ROWS", "REFUSED", "REPEATS"});
  }
  for (const psctl::TableSummary& t : s.tables()) {
    const proto::TableSpec& spec = t.spec();
    std::vector<std::string> flags;
    if (t.ranges_lost() > 0)
      flags.push_back(absl::StrCat(t.ranges_lost(), " lost"));
    if (t.ranges_unavailable() > 0) {
      flags.push_back(absl::StrCat(t.ranges_unavailable(), " unavailable"));
    }
    if (t.ranges_catching_up() > 0) {
      flags.push_back(absl::StrCat(t.ranges_catching_up(), " catching up"));
    }
    rows.push_back(
        {spec.name(), absl::StrCat(spec.id()),
         proto::TableKind_Name(spec.kind()), absl::StrCat(spec.width()),
         spec.kind() == proto::DENSE ? absl::StrCat(spec.num_keys()) : "-",
         spec.handler().name().empty() ? "sgd" : spec.handler().name(),
         t.policy(), absl::StrCat(spec.sync_workers()),
         absl::StrCat(t.ranges()), absl::StrCat(t.backups()),
         absl::StrCat(t.rows()),
         Human(static_cast<double>(t.value_bytes() + t.state_bytes())),
         absl::StrCat(t.max_staleness()), absl::StrCat(t.discarded_pushes()),
         BoundsText(spec), flags.empty() ? "ok" : absl::StrJoin(flags, ",")});
    if (wide) {
      rows.back().insert(
          rows.back().end(),
          {absl::StrCat(t.value_bytes()), absl::StrCat(t.state_bytes()),
           absl::AsciiStrToLower(
               proto::InitializerSpec::Kind_Name(spec.init().kind())),
           absl::StrCat(t.aggregated_steps()), absl::StrCat(t.row_cap()),
           absl::StrCat(t.evicted_rows()), absl::StrCat(t.expired_rows()),
           absl::StrCat(t.admitted_rows()), absl::StrCat(t.pending_ids()),
           absl::StrCat(t.cold_rows()), absl::StrCat(t.refused_writes()),
           spec.sum_repeats() ? "summed" : "each"});
    }
  }
  return TextTable(rows);
}

}  // namespace downpour
