#include "scheduler/table_registry.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "common/error_reason.h"
#include "common/logging.h"
#include "common/status_macros.h"
#include "google/protobuf/util/message_differencer.h"
#include "scheduler/capacity.h"
#include "scheduler/job_metrics.h"
#include "scheduler/placement.h"
#include "scheduler/request_checks.h"
#include "scheduler/table_spec.h"

namespace downpour {

absl::StatusOr<proto::TableSpec> SpecToDeclare(
    const proto::TableSpec& requested, const ConsistencyPolicy& policy) {
  proto::TableSpec spec = requested;
  spec.set_id(0);
  // A table that follows the job gets its enforcement from the job's
  // policy, the one rule for every table of the job; declaring it by hand
  // as well could contradict the job.
  if (spec.follows_job()) {
    if (spec.sync_workers() != 0 || spec.num_workers() != 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "table '", spec.name(), "': follows the job's policy (",
          policy.ToString(), ") but sets sync_workers ", spec.sync_workers(),
          " and num_workers ", spec.num_workers(), " itself; leave both 0"));
    }
    const ConsistencyPolicy table = policy.ForTable(spec);
    if (table.is_bsp() && !policy.is_bsp() && policy.elastic_workers > 0) {
      // A worker taking a seat of an ASP or SSP job starts at once, at the
      // gating clock, and would count as one of the N pushes of a step that
      // is under way; only a BSP job grows at an announced step.
      return absl::InvalidArgumentError(absl::StrCat(
          "table '", spec.name(), "': BSP in a ", policy.ToString(),
          " job with ", policy.elastic_workers,
          " elastic worker seats; a BSP table grows only in a BSP job "
          "(declare it SSP or ASP, or run the job under BSP)"));
    }
    spec.set_sync_workers(table.sync_workers());
    spec.set_num_workers(table.tracked_workers());
  }
  // A malformed spec fails at once, without waiting for servers.
  DP_RETURN_IF_ERROR(ValidateTableShape(spec));
  return spec;
}

TableRegistry::TableRegistry(const TableRegistryOptions& options,
                             proto::ClusterMap* map, const Membership* members,
                             DurableState* durable)
    : options_(options), map_(map), members_(members), durable_(durable) {}

absl::Status TableRegistry::Create(SchedulerMutex& lock,
                                   const proto::TableSpec& requested,
                                   absl::Time deadline, absl::Duration timeout,
                                   proto::CreateTableReply* reply) {
  proto::TableSpec spec = requested;
  // An existing table: OK once every server has it (an identical
  // declaration still pending waits for its outcome).
  auto existing_reply =
      [&](const proto::TableMap* t) ABSL_EXCLUSIVE_LOCKS_REQUIRED(lock.mu) {
        const TableId id = t->spec().id();
        if (auto p = pending_.find(id); p != pending_.end()) {
          std::shared_ptr<PendingTable> pending = p->second;
          DP_RETURN_IF_ERROR(AwaitDeclared(lock, *pending, deadline));
        }
        const proto::TableMap* now = FindTableById(id);
        if (now == nullptr) {
          return absl::AbortedError(absl::StrCat(
              "create table '", spec.name(), "': removed meanwhile; retry"));
        }
        *reply->mutable_spec() = now->spec();
        reply->set_epoch(durable_->published().epoch());
        reply->set_created(false);
        return absl::OkStatus();
      };
  {
    DP_ASSIGN_OR_RETURN(const proto::TableMap* t, FindTable(spec));
    if (t != nullptr) return existing_reply(t);
  }
  // Enough live servers first.
  const int need = std::max(1, options_.min_servers);
  auto enough = [this, &lock, need]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(lock.mu) {
    return lock.stopping ||
           static_cast<int>(members_->AliveServers().size()) >= need;
  };
  lock.mu.AwaitWithDeadline(absl::Condition(&enough), deadline);
  if (lock.stopping) return absl::UnavailableError("scheduler shutting down");
  std::vector<const proto::NodeInfo*> servers = members_->AliveServers();
  if (static_cast<int>(servers.size()) < need) {
    return absl::UnavailableError(
        absl::StrCat("create table '", spec.name(), "': ", servers.size(),
                     " live servers after ", absl::FormatDuration(timeout),
                     ", need ", need));
  }
  // The lock was released while waiting: someone may have declared it.
  {
    DP_ASSIGN_OR_RETURN(const proto::TableMap* t, FindTable(spec));
    if (t != nullptr) return existing_reply(t);
  }
  // Plugins every live server has loaded.
  std::vector<std::string> plugins(servers[0]->plugin_handlers().begin(),
                                   servers[0]->plugin_handlers().end());
  for (const auto* s : servers) {
    absl::flat_hash_set<std::string> has(s->plugin_handlers().begin(),
                                         s->plugin_handlers().end());
    plugins.erase(
        std::remove_if(plugins.begin(), plugins.end(),
                       [&](const std::string& p) { return !has.contains(p); }),
        plugins.end());
  }
  DP_RETURN_IF_ERROR(ValidateTableSpec(spec, plugins));

  // Placed on a copy: it enters the map only if every server can hold
  // its share and the map stays small.
  proto::TableMap placed;
  *placed.mutable_spec() = spec;
  // Draining servers take on nothing (unless nothing else is left).
  std::vector<NodeId> ring, waiting;
  for (const auto* s : servers) {
    waiting.push_back(s->id());
    if (!s->draining()) ring.push_back(s->id());
  }
  if (ring.empty()) ring = waiting;
  std::sort(ring.begin(), ring.end());
  std::sort(waiting.begin(), waiting.end());
  PlaceTable(&placed, ring, options_.replicas, options_.min_ranges);
  DP_RETURN_IF_ERROR(CheckTableFits(*map_, placed), "create table");
  DP_RETURN_IF_ERROR(CheckMapGrowth(
      absl::StrCat("create table '", spec.name(), "'"), map_->ByteSizeLong(),
      placed.ByteSizeLong() + 16, options_.max_map_bytes));

  spec.set_id(next_table_id_++);
  *placed.mutable_spec() = spec;
  proto::TableMap* table = map_->add_tables();
  *table = std::move(placed);
  map_->set_epoch(map_->epoch() + 1);
  const Epoch epoch = map_->epoch();
  auto pending = std::make_shared<PendingTable>();
  pending->id = spec.id();
  pending->name = spec.name();
  pending->epoch = epoch;
  pending->waiting = waiting;
  pending_[spec.id()] = pending;
  DP_LOG(INFO) << "table '" << spec.name() << "' (id " << spec.id() << ") over "
               << table->ranges_size() << " ranges, " << options_.replicas
               << " holders each, epoch " << epoch;
  // Servers see the table once it is on disk here: a restarted scheduler
  // never gives its id to another table. (`table` may move meanwhile.)
  DP_RETURN_IF_ERROR(durable_->AwaitDurable(lock, durable_->Commit()),
                     "create table '", spec.name(), "'");
  DP_RETURN_IF_ERROR(AwaitDeclared(lock, *pending, deadline));
  *reply->mutable_spec() = spec;
  reply->set_epoch(epoch);
  reply->set_created(true);
  return absl::OkStatus();
}

absl::StatusOr<const proto::TableMap*> TableRegistry::FindTable(
    const proto::TableSpec& spec) const {
  for (const auto& t : map_->tables()) {
    if (t.spec().name() != spec.name()) continue;
    proto::TableSpec existing = t.spec();
    existing.set_id(0);
    if (!google::protobuf::util::MessageDifferencer::Equals(existing, spec)) {
      return absl::AlreadyExistsError(absl::StrCat(
          "table '", spec.name(), "' exists with a different spec"));
    }
    return &t;
  }
  return nullptr;
}

const proto::TableMap* TableRegistry::FindTableById(TableId id) const {
  for (const auto& t : map_->tables()) {
    if (t.spec().id() == id) return &t;
  }
  return nullptr;
}

absl::Status TableRegistry::AwaitDeclared(SchedulerMutex& lock, PendingTable& p,
                                          absl::Time deadline) {
  auto done = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(lock.mu) {
    return lock.stopping || p.resolved || Late(p).empty();
  };
  lock.mu.AwaitWithDeadline(absl::Condition(&done), deadline);
  if (!p.resolved && Late(p).empty()) Resolve(p);
  if (!p.failure.ok()) return p.failure;
  if (p.resolved) return absl::OkStatus();
  if (lock.stopping) return absl::UnavailableError("scheduler shutting down");
  return absl::DeadlineExceededError(absl::StrCat(
      "table '", p.name, "' declared, but servers ",
      absl::StrJoin(Late(p), ", "), " did not apply epoch ", p.epoch,
      " in time; it is still being declared (a later failure on a server "
      "removes it)"));
}

std::vector<NodeId> TableRegistry::Late(const PendingTable& p) const {
  std::vector<NodeId> out;
  for (NodeId id : p.waiting) {
    const proto::NodeInfo* n = members_->Find(id);
    if (n != nullptr && n->state() == proto::ALIVE &&
        members_->applied(id) < p.epoch) {
      out.push_back(id);
    }
  }
  return out;
}

void TableRegistry::Resolve(PendingTable& p) {
  p.resolved = true;
  pending_.erase(p.id);
}

void TableRegistry::ResolvePending() {
  std::vector<std::shared_ptr<PendingTable>> done;
  for (const auto& [id, p] : pending_) {
    if (Late(*p).empty()) done.push_back(p);
  }
  for (const auto& p : done) Resolve(*p);
  // Not waited for: a restarted scheduler that still finds one pending
  // resolves it again once the servers report the epoch.
  if (!done.empty()) durable_->Commit();
}

void TableRegistry::TableFailed(NodeId node, const proto::TableFailure& f) {
  const proto::NodeInfo* n = members_->Find(node);
  const std::string server =
      absl::StrCat("server ", node, " ('", n == nullptr ? "" : n->name(), "')");
  const absl::Status why(static_cast<absl::StatusCode>(f.code()),
                         Printable(f.message(), kMaxFailureMessageBytes));
  if (auto p = pending_.find(f.table_id()); p != pending_.end()) {
    std::shared_ptr<PendingTable> pending = p->second;
    pending->failure = Annotate(
        why, absl::StrCat("table '", pending->name, "' not created: ", server,
                          " cannot create it"));
    Resolve(*pending);
    RemoveTable(f.table_id());
    map_->set_epoch(map_->epoch() + 1);
    durable_->Commit();
    DP_LOG(WARNING) << pending->failure << "; removed again, epoch "
                    << map_->epoch();
    return;
  }
  if (FindTableById(f.table_id()) == nullptr) return;  // removed already
  if (!refused_.insert({node, f.table_id()}).second) return;
  DP_LOG(WARNING) << server << " cannot hold table " << f.table_id() << ": "
                  << why;
  if (DropCatchingUp(map_, f.table_id(), node)) {
    RefillWithinRoom();
    map_->set_epoch(map_->epoch() + 1);
    DP_LOG(WARNING) << server << " taken off the ranges of table "
                    << f.table_id() << " it was catching up on, epoch "
                    << map_->epoch();
  }
  durable_->Commit();  // the refusal too
}

void TableRegistry::RemoveTable(TableId id) {
  auto* tables = map_->mutable_tables();
  for (int i = 0; i < tables->size(); ++i) {
    if (tables->Get(i).spec().id() != id) continue;
    tables->erase(tables->begin() + i);
    break;
  }
  for (auto it = refused_.begin(); it != refused_.end();) {
    if (it->second == id) {
      refused_.erase(it++);
    } else {
      ++it;
    }
  }
}

void TableRegistry::ForgetRefusals(NodeId node) {
  for (auto it = refused_.begin(); it != refused_.end();) {
    if (it->first == node) {
      refused_.erase(it++);
    } else {
      ++it;
    }
  }
}

bool TableRegistry::RefillWithinRoom() {
  absl::flat_hash_map<NodeId, uint64_t> room = RoomLeft(*map_);
  const bool refilled = Refill(map_, options_.replicas, &room, &refused_);
  const bool moved = Rebalance();
  return refilled || moved;
}

absl::Status TableRegistry::ReplicaReady(
    const proto::ReplicaReadyRequest& req) {
  if (req.hand_over()) {
    // The primary stopped writing in that map; any other map may have
    // made it write again (a retired rank completing a step), so it
    // reports again on the next one.
    if (req.epoch() != map_->epoch()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "handover report from map epoch ", req.epoch(), ", the map is at ",
          map_->epoch(), "; report again from the current map"));
    }
    if (req.backup() == req.primary()) {
      // A primary hands a range to itself to split it or to merge it with
      // a neighbour (splits.h).
      if (MergeLowerBegin(*map_, req.table_id(), req.range_begin()).ok()) {
        DP_ASSIGN_OR_RETURN(
            bool merged,
            MergeReported(req.table_id(), req.range_begin(), req.primary()));
        if (merged) {
          handover_started_ = absl::InfiniteFuture();
          Rebalance();
          map_->set_epoch(map_->epoch() + 1);
        }
        return absl::OkStatus();
      }
      DP_RETURN_IF_ERROR(
          FinishSplit(map_, req.table_id(), req.range_begin(), req.primary()));
      ++splits_done_;
      // The halves' loads are measured afresh; until then each weighs half.
      const std::pair<TableId, Key> key{req.table_id(), req.range_begin()};
      loads_.erase(key);
      for (const proto::TableMap& t : map_->tables()) {
        if (t.spec().id() != req.table_id()) continue;
        for (const proto::RangeAssignment& r : t.ranges()) {
          if (r.begin() != req.range_begin()) continue;
          boundary_born_[{req.table_id(), r.end()}] = absl::Now();
          if (auto s = sizes_.find(key); s != sizes_.end()) {
            // Read before the upper half's entry is made (which may
            // rehash the map).
            const uint64_t half = s->second /= 2;
            sizes_[{req.table_id(), r.end()}] = half;
          }
        }
      }
      handover_started_ = absl::InfiniteFuture();
      Rebalance();
      map_->set_epoch(map_->epoch() + 1);
      DP_LOG(INFO) << "table " << req.table_id() << " range from key "
                   << req.range_begin() << ": split, epoch " << map_->epoch();
      return absl::OkStatus();
    }
    DP_RETURN_IF_ERROR(HandOver(map_, req.table_id(), req.range_begin(),
                                req.primary(), req.backup()));
    // The handovers left, if any, get a full timeout from the next sweep.
    handover_started_ = absl::InfiniteFuture();
    Rebalance();
    if (options_.balance_primaries) BalancePrimaries(map_);
    map_->set_epoch(map_->epoch() + 1);
    DP_LOG(INFO) << "table " << req.table_id() << " range from key "
                 << req.range_begin() << ": handed from server "
                 << req.primary() << " to " << req.backup() << ", epoch "
                 << map_->epoch();
    return absl::OkStatus();
  }
  DP_RETURN_IF_ERROR(MarkInSync(map_, req.table_id(), req.range_begin(),
                                req.primary(), req.backup()));
  Rebalance();
  if (options_.balance_primaries) BalancePrimaries(map_);
  map_->set_epoch(map_->epoch() + 1);
  DP_LOG(INFO) << "table " << req.table_id() << " range from key "
               << req.range_begin() << ": backup " << req.backup()
               << " in sync, epoch " << map_->epoch();
  return absl::OkStatus();
}

bool TableRegistry::CancelSlowHandOvers(absl::Time now) {
  // The clock starts at the first sweep that sees handovers under way
  // (again after each one completes, and in a restarted scheduler).
  if (!HandOversUnderWay(*map_) && SplitsUnderWay(*map_) == 0 &&
      MergesUnderWay(*map_) == 0) {
    handover_started_ = absl::InfiniteFuture();
    return false;
  }
  if (handover_started_ == absl::InfiniteFuture()) handover_started_ = now;
  if (now - handover_started_ <= options_.handover_timeout) return false;
  DP_LOG(WARNING) << "primaries did not hand their ranges over within "
                  << absl::FormatDuration(options_.handover_timeout)
                  << "; the handovers are cancelled";
  // A move's handover is tried again later, not at once: meanwhile its
  // range takes writes.
  for (const proto::TableMap& t : map_->tables()) {
    for (const proto::RangeAssignment& r : t.ranges()) {
      if (r.handing_to() != kNoNode && r.handing_to() == r.move_to()) {
        handover_held_off_[{t.spec().id(), r.begin()}] =
            now + options_.handover_timeout;
      }
    }
  }
  CancelHandOvers(map_);
  // A split waits for the same report: one not made in time is called off
  // (the range takes writes again; load may start it again later).
  CancelSplits(map_);
  PruneMergeQuiet();
  handover_started_ = absl::InfiniteFuture();
  return true;
}

void TableRegistry::RemoveDeadServer(NodeId id) {
  const int primary_before = PrimaryRangesOf(*map_, id);
  RemoveServer(map_, id);
  promotions_ += primary_before - PrimaryRangesOf(*map_, id);
  Settle();
}

bool TableRegistry::ForgetServerData(NodeId id) {
  const int lost_before = LostRanges(*map_);
  if (!::downpour::ForgetServerData(map_, id)) return false;
  ranges_lost_ += LostRanges(*map_) - lost_before;
  Settle();
  return true;
}

bool TableRegistry::Settle() {
  const absl::Time now = absl::Now();
  absl::flat_hash_set<std::pair<TableId, Key>> held_off;
  for (auto it = handover_held_off_.begin(); it != handover_held_off_.end();) {
    if (it->second <= now) {
      handover_held_off_.erase(it++);
    } else {
      held_off.insert(it->first);
      ++it;
    }
  }
  const bool stale_splits = CancelStaleSplits(map_);
  PruneMergeQuiet();
  const int before = MovesUnderWay(*map_);
  if (!SettleMoves(map_, options_.replicas, &held_off)) return stale_splits;
  const int after = MovesUnderWay(*map_);
  if (after < before) moves_done_ += before - after;
  return true;
}

bool TableRegistry::StopMoving() {
  moving_stopped_ = true;
  bool changed = false;
  for (proto::NodeInfo& n : *map_->mutable_nodes()) {
    if (!n.draining()) continue;
    n.set_draining(false);
    changed = true;
  }
  const int before = MovesUnderWay(*map_);
  for (proto::TableMap& t : *map_->mutable_tables()) {
    for (proto::RangeAssignment& r : *t.mutable_ranges()) {
      if (r.move_to() != kNoNode) {
        changed |= CancelMovesFrom(map_, r.move_from());
      }
    }
  }
  moves_done_ += before - MovesUnderWay(*map_);
  return changed;
}

bool TableRegistry::Rebalance() {
  bool changed = Settle();
  if (moving_stopped_) return changed;
  MoveOptions o;
  o.replicas = options_.replicas;
  o.max_moves = options_.max_moves;
  o.balance = options_.rebalance;
  o.by = options_.balance_by;
  RangeSizes load;
  if (o.by == MoveOptions::Balance::kLoad) {
    for (const auto& [key, l] : loads_) {
      load[key] = static_cast<uint64_t>(l.rate);
    }
  }
  const int before = MovesUnderWay(*map_);
  absl::flat_hash_map<NodeId, uint64_t> room = RoomLeft(*map_);
  if (StartMoves(map_, o, &room, &refused_,
                 o.by == MoveOptions::Balance::kLoad ? &load : &sizes_)) {
    changed = true;
    const int after = MovesUnderWay(*map_);
    if (after > before) {
      moves_started_ += after - before;
      for (const proto::TableMap& t : map_->tables()) {
        for (const proto::RangeAssignment& r : t.ranges()) {
          if (r.move_to() == kNoNode) continue;
          DP_LOG(INFO) << "table '" << t.spec().name() << "' keys ["
                       << r.begin() << ", " << r.end() << "): moving from "
                       << "server " << r.move_from() << " to " << r.move_to();
        }
      }
    }
    // A move whose target already holds the range in sync moves on now.
    Settle();
  } else if (o.by == MoveOptions::Balance::kLoad && MovesUnderWay(*map_) == 0) {
    bool split = false;
    if (options_.split_hot_ranges) split = SplitForLoad();
    if (!split && options_.merge_cold_ranges) split = MergeForLoad();
    changed |= split;
  }
  return changed;
}

bool TableRegistry::SplitForLoad() {
  if (SplitsUnderWay(*map_) > 0 || MergesUnderWay(*map_) > 0 ||
      HandOversUnderWay(*map_)) {
    return false;
  }
  // Only on a full picture: every range's load measured at least twice
  // (a split's halves, and a new primary's ranges, start again).
  RangeSizes load;
  absl::flat_hash_map<std::pair<TableId, Key>, Key> split_keys;
  for (const proto::TableMap& t : map_->tables()) {
    for (const proto::RangeAssignment& r : t.ranges()) {
      auto l = loads_.find({t.spec().id(), r.begin()});
      if (l == loads_.end() || l->second.rates < 2) return false;
      load[l->first] = static_cast<uint64_t>(l->second.rate);
      split_keys[l->first] = l->second.split_key;
    }
  }
  std::optional<SplitChoice> c =
      PickSplit(*map_, load, split_keys, options_.split_threshold);
  if (!c.has_value()) return false;
  absl::StatusOr<proto::RangeAssignment> r = StartSplit(map_, c->table, c->at);
  if (!r.ok()) {
    DP_LOG(WARNING) << "split for load: " << r.status();
    return false;
  }
  ++splits_started_;
  DP_LOG(INFO) << "table " << c->table << " keys [" << r->begin() << ", "
               << r->end() << "): too hot to move whole; splitting at key "
               << c->at;
  return true;
}

absl::flat_hash_set<std::pair<TableId, Key>> TableRegistry::YoungBoundaries()
    const {
  absl::flat_hash_set<std::pair<TableId, Key>> young;
  const absl::Time now = absl::Now();
  const bool all_young = now - started_ < options_.merge_min_age;
  for (const proto::TableMap& t : map_->tables()) {
    for (int i = 1; i < t.ranges_size(); ++i) {
      const std::pair<TableId, Key> b{t.spec().id(), t.ranges(i).begin()};
      auto it = boundary_born_.find(b);
      if (all_young || (it != boundary_born_.end() &&
                        now - it->second < options_.merge_min_age)) {
        young.insert(b);
      }
    }
  }
  return young;
}

absl::StatusOr<proto::RangeAssignment> TableRegistry::StartMergeAt(
    TableId id, Key key, Key* upper_end) {
  const proto::TableMap* t = FindTableById(id);
  for (int i = 0; t != nullptr && i + 1 < t->ranges_size(); ++i) {
    const proto::RangeAssignment& lo = t->ranges(i);
    if (key < lo.begin() || key >= lo.end()) continue;
    const Key at = lo.end();
    auto it = boundary_born_.find({id, at});
    const absl::Time born = it == boundary_born_.end() ? started_ : it->second;
    const absl::Duration age = absl::Now() - born;
    if (age < options_.merge_min_age) {
      return absl::FailedPreconditionError(absl::StrCat(
          "merge table '", t->spec().name(), "' at key ", at,
          ": the boundary is ",
          absl::FormatDuration(absl::Trunc(age, absl::Seconds(1))),
          " old (as this scheduler knows it); a write cut across it may be "
          "retried until it is ",
          absl::FormatDuration(options_.merge_min_age),
          " old (ps_scheduler --merge_min_age_s)"));
    }
    break;
  }
  // A quiet report left from an earlier map (a restore) must not count
  // for this merge.
  PruneMergeQuiet();
  return StartMerge(map_, id, key, upper_end);
}

void TableRegistry::PruneMergeQuiet() {
  for (auto it = merge_quiet_.begin(); it != merge_quiet_.end();) {
    const auto [table, begin] = it->first;
    bool keep = MergeLowerBegin(*map_, table, begin).ok();
    if (const proto::TableMap* t = FindTableById(table); keep && t) {
      for (const proto::RangeAssignment& r : t->ranges()) {
        if (r.begin() == begin) keep = r.primary() == it->second;
      }
    }
    if (keep) {
      ++it;
    } else {
      merge_quiet_.erase(it++);
    }
  }
}

absl::StatusOr<bool> TableRegistry::MergeReported(TableId table, Key begin,
                                                  NodeId primary) {
  DP_ASSIGN_OR_RETURN(Key lower, MergeLowerBegin(*map_, table, begin));
  Key upper = lower;
  if (const proto::TableMap* t = FindTableById(table); t != nullptr) {
    for (const proto::RangeAssignment& r : t->ranges()) {
      if (r.begin() == lower) upper = r.end();
      if (r.begin() == begin && r.primary() != primary) {
        return absl::FailedPreconditionError(
            absl::StrCat("table ", table, " range from key ", begin,
                         ": merge report from "
                         "server ",
                         primary, ", but its primary is ", r.primary()));
      }
    }
  }
  PruneMergeQuiet();
  merge_quiet_[{table, begin}] = primary;
  if (!merge_quiet_.contains({table, lower}) ||
      !merge_quiet_.contains({table, upper})) {
    return false;  // the other neighbour has yet to report
  }
  DP_RETURN_IF_ERROR(FinishMerge(map_, table, lower));
  merge_quiet_.erase({table, lower});
  merge_quiet_.erase({table, upper});
  boundary_born_.erase({table, upper});
  ++merges_done_;
  // The merged range's load is measured afresh; its size is the halves'.
  loads_.erase({table, lower});
  loads_.erase({table, upper});
  if (auto hi = sizes_.find({table, upper}); hi != sizes_.end()) {
    // Erased before the lower's entry is made: making it may rehash the
    // map, and `hi` would point nowhere (the scheduler once aborted here).
    const uint64_t bytes = hi->second;
    sizes_.erase(hi);
    sizes_[{table, lower}] += bytes;
  }
  DP_LOG(INFO) << "table " << table << " range from key " << lower
               << ": merged with the range from key " << upper << ", epoch "
               << map_->epoch() + 1;
  return true;
}

bool TableRegistry::MergeForLoad() {
  if (SplitsUnderWay(*map_) > 0 || MergesUnderWay(*map_) > 0 ||
      HandOversUnderWay(*map_) || MovesUnderWay(*map_) > 0) {
    return false;
  }
  RangeSizes load;
  for (const proto::TableMap& t : map_->tables()) {
    for (const proto::RangeAssignment& r : t.ranges()) {
      auto l = loads_.find({t.spec().id(), r.begin()});
      if (l == loads_.end() || l->second.rates < 2) continue;
      load[l->first] = static_cast<uint64_t>(l->second.rate);
    }
  }
  std::optional<SplitChoice> c =
      PickMerge(*map_, load, YoungBoundaries(), options_.merge_threshold);
  if (!c.has_value()) return false;
  Key upper_end = 0;
  PruneMergeQuiet();
  absl::StatusOr<proto::RangeAssignment> r =
      StartMerge(map_, c->table, c->begin, &upper_end);
  if (!r.ok()) {
    DP_LOG(WARNING) << "merge for load: " << r.status();
    return false;
  }
  ++merges_started_;
  DP_LOG(INFO) << "table " << c->table << " keys [" << r->begin() << ", "
               << upper_end << "): cold neighbours; merging at key " << c->at;
  return true;
}

absl::StatusOr<proto::SplitRangeReply> TableRegistry::Split(
    const proto::SplitRangeRequest& req) {
  const proto::TableMap* table = nullptr;
  for (const proto::TableMap& t : map_->tables()) {
    if (t.spec().name() == req.table()) table = &t;
  }
  if (table == nullptr || pending_.contains(table->spec().id())) {
    return absl::NotFoundError(
        absl::StrCat("split: no table '", req.table(), "'"));
  }
  if (moving_stopped_) {
    return absl::FailedPreconditionError(
        absl::StrCat("split table '", req.table(),
                     "': the scheduler is stopping; nothing moves any more"));
  }
  const TableId id = table->spec().id();
  if (req.merge()) {
    Key upper_end = 0;
    DP_ASSIGN_OR_RETURN(proto::RangeAssignment lo,
                        StartMergeAt(id, req.key(), &upper_end));
    ++merges_started_;
    map_->set_epoch(map_->epoch() + 1);
    DP_LOG(INFO) << "table '" << req.table() << "' keys [" << lo.begin() << ", "
                 << upper_end << "): merging at key " << lo.end()
                 << " (asked), epoch " << map_->epoch();
    proto::SplitRangeReply reply;
    reply.set_table_id(id);
    reply.set_begin(lo.begin());
    reply.set_end(upper_end);
    reply.set_split_at(lo.end());
    reply.set_epoch(map_->epoch());
    return reply;
  }
  DP_ASSIGN_OR_RETURN(proto::RangeAssignment r,
                      StartSplit(map_, id, req.key()));
  ++splits_started_;
  map_->set_epoch(map_->epoch() + 1);
  DP_LOG(INFO) << "table '" << req.table() << "' keys [" << r.begin() << ", "
               << r.end() << "): splitting at key " << r.split_at()
               << " (asked), epoch " << map_->epoch();
  proto::SplitRangeReply reply;
  reply.set_table_id(id);
  reply.set_begin(r.begin());
  reply.set_end(r.end());
  reply.set_split_at(r.split_at());
  reply.set_epoch(map_->epoch());
  return reply;
}

bool TableRegistry::HoldsRanges(NodeId id) const {
  return HoldsAnyRange(*map_, id);
}

void TableRegistry::ReportRanges(NodeId primary,
                                 const proto::HeartbeatRequest& req,
                                 absl::Time now) {
  for (const proto::RangeLoad& r : req.ranges()) {
    const proto::TableMap* t = FindTableById(r.table_id());
    if (t == nullptr) continue;
    bool is_primary = false;
    for (const proto::RangeAssignment& a : t->ranges()) {
      if (a.begin() == r.begin() && a.end() == r.end() &&
          a.primary() == primary) {
        is_primary = true;
        break;
      }
    }
    if (!is_primary) continue;
    const std::pair<TableId, Key> key{r.table_id(), r.begin()};
    if (t->spec().kind() != proto::DENSE) sizes_[key] = r.bytes();
    Load& l = loads_[key];
    // Counters start again on a new primary: a new baseline then.
    if (l.primary == primary && r.requests() >= l.requests &&
        r.keys() >= l.keys && now > l.at) {
      const double seconds = absl::ToDoubleSeconds(now - l.at);
      const double rate =
          static_cast<double>(r.requests() - l.requests + r.keys() - l.keys) /
          seconds;
      l.rate = l.rates == 0 ? rate : 0.5 * l.rate + 0.5 * rate;
      ++l.rates;
    }
    l.split_key = r.split_key();
    l.primary = primary;
    l.requests = r.requests();
    l.keys = r.keys();
    l.at = now;
  }
}

absl::Status TableRegistry::Drain(const proto::DrainRequest& req,
                                  proto::DrainReply* reply) {
  const proto::NodeInfo* node = nullptr;
  if (req.node_id() != kNoNode) {
    node = members_->Find(req.node_id());
  } else if (!req.name().empty()) {
    node = members_->FindByName(req.name(), proto::SERVER);
  } else {
    return absl::InvalidArgumentError("drain: name a server (or its id)");
  }
  const std::string who = req.node_id() != kNoNode
                              ? absl::StrCat("node ", req.node_id())
                              : absl::StrCat("server '", req.name(), "'");
  if (node == nullptr) {
    return absl::NotFoundError(absl::StrCat("drain: no ", who));
  }
  if (node->role() != proto::SERVER) {
    return absl::InvalidArgumentError(
        absl::StrCat("drain: ", who, " is a ",
                     proto::NodeRole_Name(node->role()), ", not a server"));
  }
  const NodeId id = node->id();
  reply->set_node_id(id);
  reply->set_name(node->name());
  auto fill = [&] {
    const proto::NodeInfo* n = members_->Find(id);
    reply->set_draining(n != nullptr && n->draining());
    reply->set_left(n != nullptr && n->state() == proto::LEFT);
    reply->set_ranges_held(RangesHeld(*map_, id));
    reply->set_moves_under_way(MovesFrom(*map_, id));
  };
  if (node->state() == proto::LEFT) {
    fill();
    return absl::OkStatus();
  }
  if (node->state() != proto::ALIVE) {
    return absl::NotFoundError(
        absl::StrCat("drain: ", who, " (node ", id, ") is not alive (",
                     proto::NodeState_Name(node->state()),
                     "); its ranges were failed over"));
  }
  proto::NodeInfo* mutable_node = nullptr;
  for (proto::NodeInfo& n : *map_->mutable_nodes()) {
    if (n.id() == id) mutable_node = &n;
  }
  if (moving_stopped_ && !req.cancel()) {
    return absl::UnavailableError(absl::StrCat(
        "drain ", who, ": the scheduler is stopping; nothing moves any more"));
  }
  if (req.cancel()) {
    if (mutable_node->draining()) {
      mutable_node->set_draining(false);
      const int before = MovesUnderWay(*map_);
      CancelMovesFrom(map_, id);
      moves_done_ += before - MovesUnderWay(*map_);
      map_->set_epoch(map_->epoch() + 1);
      DP_LOG(INFO) << "drain of server " << id << " ('" << node->name()
                   << "') called off; epoch " << map_->epoch();
    }
    fill();
    return absl::OkStatus();
  }
  if (!mutable_node->draining()) {
    for (const proto::NodeInfo& n : map_->nodes()) {
      if (n.role() == proto::SERVER && n.state() == proto::ALIVE &&
          n.draining()) {
        return WithReason(
            absl::FailedPreconditionError(absl::StrCat(
                "drain ", who, ": server ", n.id(), " ('", n.name(),
                "') is being drained; one drain runs at a time (retry once "
                "it has left, or call it off: psctl drain --cancel)")),
            ErrorReason::kDrainUnderWay);
      }
    }
    DP_RETURN_IF_ERROR(CheckDrainable(*map_, id, options_.replicas));
    mutable_node->set_draining(true);
    // Moves under way to it are called off; nothing new goes to it.
    for (proto::TableMap& t : *map_->mutable_tables()) {
      for (proto::RangeAssignment& r : *t.mutable_ranges()) {
        if (r.move_to() == id) {
          r.clear_move_to();
          r.clear_move_from();
          ++moves_done_;
        }
      }
    }
    Rebalance();
    map_->set_epoch(map_->epoch() + 1);
    DP_LOG(INFO) << "draining server " << id << " ('" << node->name()
                 << "'): " << RangesHeld(*map_, id) << " range(s) to move, "
                 << MovesFrom(*map_, id) << " under way; epoch "
                 << map_->epoch();
  }
  fill();
  return absl::OkStatus();
}

void TableRegistry::LoadCheckpoint(const proto::CheckpointManifest& m) {
  map_->clear_tables();
  for (const auto& t : m.tables()) {
    proto::TableMap* table = map_->add_tables();
    *table->mutable_spec() = t.spec();
    next_table_id_ = std::max<TableId>(next_table_id_, t.spec().id() + 1);
    for (const auto& r : t.ranges()) {
      proto::RangeAssignment* a = table->add_ranges();
      a->set_begin(r.begin());
      a->set_end(r.end());
      a->set_primary(members_->FindByName(r.server(), proto::SERVER)->id());
      a->set_lost(true);
    }
  }
}

void TableRegistry::ServeRestored() {
  for (auto& t : *map_->mutable_tables()) {
    for (auto& r : *t.mutable_ranges()) r.set_lost(false);
  }
  RefillWithinRoom();
}

void TableRegistry::Export(proto::SchedulerState* state) const {
  state->set_next_table_id(next_table_id_);
  for (const auto& [id, p] : pending_) {
    proto::SchedulerState::PendingTable* t = state->add_pending_tables();
    t->set_id(p->id);
    t->set_name(p->name);
    t->set_epoch(p->epoch);
    for (NodeId n : p->waiting) t->add_waiting(n);
  }
  for (const auto& [node, table] : refused_) {
    proto::SchedulerState::Refusal* r = state->add_refusals();
    r->set_node(node);
    r->set_table(table);
  }
}

void TableRegistry::Import(const proto::SchedulerState& state) {
  next_table_id_ = std::max<TableId>(1, state.next_table_id());
  for (const auto& t : state.pending_tables()) {
    if (FindTableById(t.id()) == nullptr) continue;
    auto p = std::make_shared<PendingTable>();
    p->id = t.id();
    p->name = t.name();
    p->epoch = t.epoch();
    p->waiting.assign(t.waiting().begin(), t.waiting().end());
    pending_[p->id] = std::move(p);
  }
  for (const auto& r : state.refusals()) {
    if (FindTableById(r.table()) != nullptr) {
      refused_.insert({r.node(), r.table()});
    }
  }
}

}  // namespace downpour
