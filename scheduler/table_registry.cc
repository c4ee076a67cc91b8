#include "scheduler/table_registry.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
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
  std::vector<NodeId> ring;
  for (const auto* s : servers) ring.push_back(s->id());
  std::sort(ring.begin(), ring.end());
  PlaceTable(&placed, ring, options_.replicas);
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
  pending->waiting = ring;
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

void TableRegistry::RefillWithinRoom() {
  absl::flat_hash_map<NodeId, uint64_t> room = RoomLeft(*map_);
  Refill(map_, options_.replicas, &room, &refused_);
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
    DP_RETURN_IF_ERROR(HandOver(map_, req.table_id(), req.range_begin(),
                                req.primary(), req.backup()));
    // The handovers left, if any, get a full timeout from the next sweep.
    handover_started_ = absl::InfiniteFuture();
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
  if (!HandOversUnderWay(*map_)) {
    handover_started_ = absl::InfiniteFuture();
    return false;
  }
  if (handover_started_ == absl::InfiniteFuture()) handover_started_ = now;
  if (now - handover_started_ <= options_.handover_timeout) return false;
  DP_LOG(WARNING) << "primaries did not hand their ranges over within "
                  << absl::FormatDuration(options_.handover_timeout)
                  << "; the handovers are cancelled";
  CancelHandOvers(map_);
  handover_started_ = absl::InfiniteFuture();
  return true;
}

void TableRegistry::RemoveDeadServer(NodeId id) {
  const int primary_before = PrimaryRangesOf(*map_, id);
  RemoveServer(map_, id);
  promotions_ += primary_before - PrimaryRangesOf(*map_, id);
}

bool TableRegistry::ForgetServerData(NodeId id) {
  const int lost_before = LostRanges(*map_);
  if (!::downpour::ForgetServerData(map_, id)) return false;
  ranges_lost_ += LostRanges(*map_) - lost_before;
  return true;
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
