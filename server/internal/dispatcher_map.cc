// Dispatcher, part two: applying a new cluster map (see dispatcher.h).
// PrepareMap allocates what a map needs (the slow part) off the data
// thread; InstallMap then creates, promotes, demotes and drops this
// server's ranges and tells the replicator each primary range's backups.
#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/error_reason.h"
#include "common/logging.h"
#include "server/internal/dispatcher.h"
#include "server/internal/range_split.h"

namespace downpour {
namespace server_internal {

using Role = TableShard::Range::Role;

namespace {

uint64_t SatAdd(uint64_t a, uint64_t b) {
  return b > UINT64_MAX - a ? UINT64_MAX : a + b;
}

uint64_t SatMul(uint64_t a, uint64_t b) {
  return a != 0 && b > UINT64_MAX / a ? UINT64_MAX : a * b;
}

// The bytes a range of `layout` holds once used: dense arrays whole
// (handler state and named vectors are allocated on first use, but will
// be), bounded sparse ranges their cap, other sparse ranges what `store`
// holds now (nothing when new).
uint64_t RangeBytes(const TableLayout& layout, KeyRange range,
                    const RangeStore* store) {
  if (!layout.dense && layout.bounds.max_rows > 0) {
    return SatMul(layout.BoundsOf(range).max_rows,
                  SparseRowBytes(layout.width, layout.state_width));
  }
  if (!layout.dense) return store == nullptr ? 0 : store->allocated_bytes();
  const uint64_t row_floats =
      SatAdd(SatMul(layout.width, layout.num_vectors), layout.state_width);
  return SatMul(range.size(), SatMul(sizeof(float), row_floats));
}

// This server's part in a range of the map.
enum class Part { kNone, kPrimary, kBackup };

Part PartOf(const proto::RangeAssignment& r, NodeId self) {
  if (r.primary() == self) return Part::kPrimary;
  for (NodeId n : r.replicas()) {
    if (n == self) return Part::kBackup;
  }
  for (NodeId n : r.catching_up()) {
    if (n == self) return Part::kBackup;
  }
  return Part::kNone;
}

// Whether the fault-injection gates hold range `r`'s copies and handover
// (Dispatcher::InjectGates): every range's if `node` is empty, else those
// of a move from or to the server named `node`.
bool HeldByGates(
    const proto::RangeAssignment& r,
    const absl::flat_hash_map<NodeId, const proto::NodeInfo*>& nodes,
    const std::string& node) {
  if (node.empty()) return true;
  if (r.move_to() == kNoNode) return false;
  for (NodeId n : {r.move_from(), r.move_to()}) {
    auto it = nodes.find(n);
    if (it != nodes.end() && it->second->name() == node) return true;
  }
  return false;
}

// The ranges held here, none lost, that lie end to end over exactly
// `range`, if there are two or more (a merge's pieces); else none.
std::vector<TableShard::Range*> HeldPiecesOf(TableShard& shard,
                                             KeyRange range) {
  std::vector<TableShard::Range*> pieces;
  Key at = range.begin;
  while (at < range.end) {
    auto it = shard.ranges().find(at);
    if (it == shard.ranges().end() || it->second->lost ||
        it->second->range().end > range.end || it->second->range().end <= at) {
      return {};
    }
    pieces.push_back(it->second.get());
    at = it->second->range().end;
  }
  if (pieces.size() < 2) return {};
  return pieces;
}

// A primary the map lists among the range's in-sync backups handed the
// range over (RangeAssignment.handing_to): it stopped writing, reported
// that its backups held everything, and only then did the scheduler swap
// the two, so it holds exactly what the new primary holds. (A primary
// demoted any other way, by a failover, comes back as catching up.)
bool HandedOver(const proto::RangeAssignment& r, NodeId self) {
  return std::find(r.replicas().begin(), r.replicas().end(), self) !=
         r.replicas().end();
}

}  // namespace

std::unique_ptr<Dispatcher::PreparedMap> Dispatcher::PrepareMap(
    const proto::ClusterMap& map) const {
  auto prepared = std::make_unique<PreparedMap>();
  prepared->map = map;
  auto fail = [&](TableId id, const absl::Status& why) {
    DP_LOG(ERROR) << "cannot serve table " << id << ": " << why;
    if (prepared->status.ok()) prepared->status = why;
    prepared->failures.emplace_back(id, why);
  };
  // Table storage this server holds with the tables counted so far.
  uint64_t committed = 0;
  for (const proto::TableMap& table : map.tables()) {
    const TableId id = table.spec().id();
    std::shared_ptr<TableShard> shard;
    {
      absl::MutexLock lock(&mu_);
      auto it = tables_.find(id);
      if (it != tables_.end()) shard = it->second;
    }
    const bool is_new = shard == nullptr;
    if (is_new) {
      auto created = TableShard::Create(table.spec(), {}, plugins_,
                                        pin_options_, cold_store_);
      if (!created.ok()) {
        fail(id, created.status());
        continue;
      }
      shard = std::move(*created);
    }
    uint64_t held_bytes = 0, fresh_bytes = 0;
    std::vector<KeyRange> fresh;
    for (const proto::RangeAssignment& r : table.ranges()) {
      const Part part = PartOf(r, self_);
      if (part == Part::kNone) continue;
      const KeyRange range{r.begin(), r.end()};
      // Read without the data thread's help: PrepareMap never runs while
      // InstallMap changes the ranges.
      const TableShard::Range* held = shard->FindExact(range);
      // (Only a proper piece, begin < end: it then holds no more than the
      // range it is cut from, which is allocated already.)
      if (held == nullptr && !r.lost() && range.begin < range.end) {
        // A piece of a held range that the map split: cut from it in
        // place (SplitHeldRanges), nothing new to allocate.
        const TableShard::Range* whole = shard->Find(range.begin);
        if (whole != nullptr && !whole->lost &&
            whole->range().end >= range.end && !(whole->range() == range)) {
          held_bytes =
              SatAdd(held_bytes, RangeBytes(shard->layout(), range, nullptr));
          continue;
        }
        // Held neighbours that the map merged: joined in place
        // (MergeHeldRanges); for a moment the server holds them twice.
        if (!HeldPiecesOf(*shard, range).empty()) {
          held_bytes =
              SatAdd(held_bytes, RangeBytes(shard->layout(), range, nullptr));
          continue;
        }
      }
      // A demoted primary may hold writes its successor lacks: it starts
      // over from a copy like any new backup, unless it handed the range
      // over.
      if (held == nullptr || (held->role == Role::kPrimary &&
                              part == Part::kBackup && !HandedOver(r, self_))) {
        fresh.push_back(range);
        fresh_bytes =
            SatAdd(fresh_bytes, RangeBytes(shard->layout(), range, nullptr));
      } else {
        held_bytes = SatAdd(
            held_bytes, RangeBytes(shard->layout(), range, held->store.get()));
      }
    }
    committed = SatAdd(committed, held_bytes);
    auto refuse = [&](const absl::Status& why) {
      fail(id, why);
      for (const KeyRange& r : fresh) {
        prepared->refused.insert({id, r.begin});
        prepared->fresh.erase({id, r.begin});
      }
    };
    if (max_table_bytes_ > 0 && !fresh.empty() &&
        SatAdd(committed, fresh_bytes) > max_table_bytes_) {
      refuse(absl::ResourceExhaustedError(absl::StrCat(
          "table '", table.spec().name(), "': server ", self_, " cannot hold ",
          fresh.size(), " more range(s) of it (", fresh_bytes,
          " bytes): it holds ", committed,
          " bytes of tables and its limit "
          "is ",
          max_table_bytes_, " bytes (ps_server --max_table_bytes)")));
      continue;
    }
    // Without a limit, a size past what any machine addresses would wrap
    // around in the allocation's own arithmetic: refused the same way.
    if (!fresh.empty() && fresh_bytes > (uint64_t{1} << 62)) {
      refuse(absl::ResourceExhaustedError(
          absl::StrCat("table '", table.spec().name(), "': server ", self_,
                       " cannot hold ", fresh_bytes, " bytes of it")));
      continue;
    }
    bool allocated = true;
    for (const KeyRange& r : fresh) {
      try {
        prepared->fresh[{id, r.begin}] = shard->NewRange(r);
      } catch (const std::bad_alloc&) {
        refuse(absl::ResourceExhaustedError(
            absl::StrCat("table '", table.spec().name(), "': server ", self_,
                         " could not allocate keys [", r.begin, ", ", r.end,
                         ") (", fresh_bytes, " bytes for its new ranges)")));
        allocated = false;
        break;
      }
    }
    if (!allocated) continue;
    committed = SatAdd(committed, fresh_bytes);
    if (is_new) prepared->new_tables[id] = shard;
  }
  return prepared;
}

void Dispatcher::AbandonSteps(TableShard::Range& range,
                              const absl::Status& why) {
  std::vector<uint64_t> waiters;
  for (auto& [part, steps] : range.steps) {
    std::vector<uint64_t> w = steps.Abandon();
    waiters.insert(waiters.end(), w.begin(), w.end());
  }
  AnswerWithError(waiters, why);
}

void Dispatcher::AnswerWithError(const std::vector<uint64_t>& tokens,
                                 const absl::Status& why) {
  for (uint64_t token : tokens) pull_waiters_.erase(token);
  if (env_ == nullptr) return;
  for (uint64_t token : tokens) {
    DeferredReply d;
    d.reply_token = token;
    d.reply.header.set_server_id(self_);
    SetReplyStatus(why, &d.reply.header);
    env_->SendDeferred(std::move(d));
  }
}

void Dispatcher::RetireRanks(TableShard& shard, absl::Span<const int> ranks,
                             Epoch epoch) {
  std::vector<uint64_t> orphans;
  std::vector<TableShard::HeldStep> complete;
  shard.Retire(ranks, &orphans, &complete);
  AnswerWithError(orphans,
                  absl::FailedPreconditionError(absl::StrCat(
                      "table '", shard.spec().name(),
                      "': the job went on without this worker's rank "
                      "(lost and not replaced, or it left for good; epoch ",
                      epoch, "); its held push was dropped")));
  size_t answered = 0;
  for (const TableShard::HeldStep& step : complete) {
    const size_t first_waiter = waiters_.size();
    room_.clear();
    const TableShard::SyncOutcome outcome =
        shard.CompleteStep(step, &waiters_, &applied_keys_, &room_);
    const Key begin = step.part.begin, end = step.part.end;
    const bool replicated = Replicated(shard, *step.range);
    std::vector<ForwardedWrite> forwards;
    if (replicated) {
      ForwardRoom(shard, step.range, room_, &forwards);
      if (outcome.status.ok() || !shard.layout().dense) {
        forwards.push_back(StepForward(shard, step.range, begin, end,
                                       step.clock, outcome.applied, nullptr));
      }
    }
    std::vector<DeferredReply> released;
    ReleaseStepWaiters(shard, *step.range, begin, end,
                       shard.layout().dense ? end - begin : 0, step.clock + 1,
                       replicated, first_waiter, outcome.status, &released);
    answered += released.size();
    if (env_ == nullptr) continue;
    for (DeferredReply& d : released) {
      d.reply.header.set_server_id(self_);
      d.reply.header.set_server_epoch(epoch);
    }
    if (forwards.empty()) {
      for (DeferredReply& d : released) env_->SendDeferred(std::move(d));
    } else {
      replicator_->Hold(std::move(forwards), std::move(released), 0, 0);
    }
  }
  if (!complete.empty() || !orphans.empty()) {
    DP_LOG(INFO) << "table '" << shard.spec().name() << "': " << complete.size()
                 << " held step(s) applied without the retired rank(s), "
                 << answered << " push(es) answered, " << orphans.size()
                 << " of the retired rank(s) refused (epoch " << epoch << ")";
  }
}

absl::Status Dispatcher::InstallMap(std::unique_ptr<PreparedMap> prepared) {
  const proto::ClusterMap& map = prepared->map;
  const Epoch epoch = map.epoch();
  absl::flat_hash_map<NodeId, const proto::NodeInfo*> nodes;
  for (const proto::NodeInfo& n : map.nodes()) nodes[n.id()] = &n;
  const absl::Status moved =
      WithReason(absl::AbortedError(absl::StrCat(
                     "not owner: the range moved away from server ", self_,
                     " in epoch ", epoch, "; retry with a fresh map")),
                 ErrorReason::kNotOwner);
  for (const proto::TableMap& table : map.tables()) {
    const TableId id = table.spec().id();
    std::shared_ptr<TableShard> shard;
    {
      absl::MutexLock lock(&mu_);
      auto it = tables_.find(id);
      if (it != tables_.end()) {
        shard = it->second;
      } else if (auto n = prepared->new_tables.find(id);
                 n != prepared->new_tables.end()) {
        shard = n->second;
        tables_.emplace(id, shard);
      }
    }
    if (shard == nullptr) continue;  // its spec was refused
    std::map<Key, const proto::RangeAssignment*> mine;
    for (const proto::RangeAssignment& r : table.ranges()) {
      if (PartOf(r, self_) != Part::kNone) mine[r.begin()] = &r;
    }
    auto drop = [&](TableShard::Range& range) {
      DropRange(id, *shard, range, moved);
    };
    SplitHeldRanges(id, *shard, table, epoch);
    MergeHeldRanges(id, *shard, table, epoch);
    std::vector<TableShard::Range*> leaving;
    for (const auto& [begin, range] : shard->ranges()) {
      auto it = mine.find(begin);
      if (it == mine.end() || it->second->end() != range->range().end) {
        leaving.push_back(range.get());
      }
    }
    for (TableShard::Range* r : leaving) {
      DP_LOG(INFO) << "table '" << shard->spec().name() << "' keys ["
                   << r->range().begin << ", " << r->range().end
                   << "): no longer held here (epoch " << epoch << ")";
      drop(*r);
    }
    for (const auto& [begin, assignment] : mine) {
      const Part part = PartOf(*assignment, self_);
      const KeyRange kr{assignment->begin(), assignment->end()};
      TableShard::Range* range = shard->FindExact(kr);
      if (range != nullptr && range->role == Role::kPrimary &&
          part == Part::kBackup && HandedOver(*assignment, self_)) {
        if (range->handing_to != assignment->primary()) {
          DP_LOG(ERROR) << "table '" << shard->spec().name() << "' keys ["
                        << kr.begin << ", " << kr.end << "): listed in sync "
                        << "under primary " << assignment->primary()
                        << " without a handover to it here";
        }
        DP_LOG(INFO) << "table '" << shard->spec().name() << "' keys ["
                     << kr.begin << ", " << kr.end << "): handed to server "
                     << assignment->primary() << " in epoch " << epoch
                     << "; an in-sync backup now";
        // Pushes held for a BSP step the new primary completes: their
        // workers retry there.
        // (The replicator lets the range go below, as for any backup.)
        AbandonSteps(*range, moved);
        if (replicator_ != nullptr) replicator_->ForgetStream(id, begin);
      } else if (range != nullptr && range->role == Role::kPrimary &&
                 part == Part::kBackup) {
        DP_LOG(WARNING) << "table '" << shard->spec().name() << "' keys ["
                        << kr.begin << ", " << kr.end
                        << "): demoted to a backup in epoch " << epoch
                        << "; starting over from a copy";
        drop(*range);
        range = nullptr;
      }
      if (range == nullptr) {
        // No memory for it here: the scheduler hears of it (AckEpoch).
        if (prepared->refused.count({id, begin}) > 0) continue;
        std::unique_ptr<TableShard::Range> fresh;
        auto f = prepared->fresh.find({id, begin});
        if (f != prepared->fresh.end()) {
          fresh = std::move(f->second);
        } else {
          fresh = shard->NewRange(kr);
        }
        range = shard->AddRange(std::move(fresh));
        if (replicator_ != nullptr) replicator_->ForgetStream(id, begin);
        DP_LOG(INFO) << "table '" << shard->spec().name() << "' (id " << id
                     << ") keys [" << kr.begin << ", " << kr.end
                     << "): " << (part == Part::kPrimary ? "primary" : "backup")
                     << (assignment->lost() ? " of a LOST range" : "")
                     << ", epoch " << epoch;
      } else if (range->role == Role::kBackup && part == Part::kPrimary) {
        DP_LOG(INFO) << "table '" << shard->spec().name() << "' keys ["
                     << kr.begin << ", " << kr.end
                     << "): promoted to primary in epoch " << epoch;
        // Writes the old primary could not finish wait for their clients'
        // retries, which the copied client ledger recognises.
      }
      range->role = part == Part::kPrimary ? Role::kPrimary : Role::kBackup;
      range->primary = assignment->primary();
      range->lost = assignment->lost();
      range->step_cuts.assign(assignment->step_cuts().begin(),
                              assignment->step_cuts().end());
      range->backups =
          assignment->replicas_size() + assignment->catching_up_size();
      // A split or merge fences the range as a handover does, to itself:
      // writes are refused until the replicator reports every one on the
      // backups.
      range->handing_to = kNoNode;
      if (part == Part::kPrimary) {
        const bool fenced =
            assignment->split_at() != 0 ||
            assignment->merge() != proto::RangeAssignment::NO_MERGE;
        range->handing_to = assignment->handing_to() != kNoNode
                                ? assignment->handing_to()
                                : (fenced ? self_ : kNoNode);
      }
      if (replicator_ == nullptr) continue;
      if (part == Part::kPrimary) {
        std::vector<BackupInfo> backups;
        auto add = [&](NodeId n, bool in_sync) {
          auto node = nodes.find(n);
          if (node == nodes.end()) return;
          backups.push_back({n, node->second->data_endpoint(),
                             node->second->incarnation(), in_sync});
        };
        for (NodeId n : assignment->replicas()) add(n, true);
        for (NodeId n : assignment->catching_up()) add(n, false);
        replicator_->SetBackups(id, range, backups, epoch,
                                HeldByGates(*assignment, nodes, gated_node_));
        replicator_->HandOver(id, begin, epoch);
      } else {
        replicator_->DropPrimary(id, begin, moved);
      }
    }
    if (table.spec().follows_job() && map.retired_ranks_size() > 0) {
      RetireRanks(*shard, map.retired_ranks(), epoch);
    }
    if (table.spec().follows_job()) {
      shard->SetJoinedWorkers(static_cast<int>(map.job_workers()),
                              std::vector<Clock>(map.seat_clocks().begin(),
                                                 map.seat_clocks().end()));
    }
  }
  // Tables gone from the map (a declaration the scheduler rolled back)
  // are dropped with their ranges.
  absl::flat_hash_set<TableId> listed;
  for (const proto::TableMap& table : map.tables()) {
    listed.insert(table.spec().id());
  }
  std::vector<std::pair<TableId, std::shared_ptr<TableShard>>> gone;
  {
    absl::MutexLock lock(&mu_);
    if (epoch >= epoch_) {
      for (const auto& [id, shard] : tables_) {
        if (!listed.contains(id)) gone.emplace_back(id, shard);
      }
      for (const auto& [id, shard] : gone) tables_.erase(id);
    }
  }
  const absl::Status removed = absl::NotFoundError(absl::StrCat(
      "the table was removed from the cluster map in epoch ", epoch));
  for (const auto& [id, shard] : gone) {
    DP_LOG(INFO) << "table '" << shard->spec().name() << "' (id " << id
                 << ") removed from the map in epoch " << epoch << "; dropped";
    std::vector<TableShard::Range*> ranges;
    for (const auto& [begin, range] : shard->ranges()) {
      ranges.push_back(range.get());
    }
    for (TableShard::Range* r : ranges) DropRange(id, *shard, *r, removed);
  }
  absl::MutexLock lock(&mu_);
  if (epoch > epoch_) epoch_ = epoch;
  return prepared->status;
}

void Dispatcher::SplitHeldRanges(TableId id, TableShard& shard,
                                 const proto::TableMap& table, Epoch epoch) {
  // The map's ranges by begin key.
  std::map<Key, const proto::RangeAssignment*> listed;
  for (const proto::RangeAssignment& r : table.ranges()) listed[r.begin()] = &r;
  std::vector<std::pair<TableShard::Range*, std::vector<Key>>> splits;
  for (const auto& [begin, range] : shard.ranges()) {
    const KeyRange kr = range->range();
    auto it = listed.find(begin);
    if (it == listed.end() || it->second->end() >= kr.end || range->lost) {
      continue;
    }
    // The map lists pieces of it end to end, none lost (a restore's
    // ranges start afresh), and this server holds one in sync: the range
    // was split (maybe more than once in the maps it did not see). It is
    // cut into all of them; the pieces it no longer holds go below.
    std::vector<Key> cuts;
    bool held_in_sync = false;
    Key at = kr.begin;
    while (at < kr.end) {
      auto piece = listed.find(at);
      // (A piece that ends where it begins, or before, is no piece: a
      // malformed map, which must not keep this loop going.)
      if (piece == listed.end() || piece->second->end() > kr.end ||
          piece->second->end() <= at || piece->second->lost()) {
        break;
      }
      const proto::RangeAssignment& a = *piece->second;
      held_in_sync |= a.primary() == self_ ||
                      std::find(a.replicas().begin(), a.replicas().end(),
                                self_) != a.replicas().end();
      if (at != kr.begin) cuts.push_back(at);
      at = a.end();
    }
    if (at == kr.end && held_in_sync) {
      splits.emplace_back(range.get(), std::move(cuts));
    }
  }
  const absl::Status split = WithReason(
      absl::AbortedError(absl::StrCat("not owner: the range was split in "
                                      "epoch ",
                                      epoch, "; retry with a fresh map")),
      ErrorReason::kNotOwner);
  for (auto& [range, cuts] : splits) {
    const KeyRange kr = range->range();
    // Held steps cannot complete here any more: their workers resend,
    // and their clients cut the pushes where the pieces meet.
    AbandonSteps(*range, split);
    absl::StatusOr<std::vector<std::unique_ptr<TableShard::Range>>> pieces =
        SplitRange(shard, *range, cuts);
    if (!pieces.ok()) {
      // Cannot happen (the rows are read back from memory); the pieces
      // then start over as a new holder would.
      DP_LOG(ERROR) << "table '" << shard.spec().name() << "' keys ["
                    << kr.begin << ", " << kr.end
                    << "): cannot split: " << pieces.status();
      continue;
    }
    if (replicator_ != nullptr) {
      // New streams for the pieces (SetBackups, below): the old one ends.
      replicator_->DropPrimary(id, kr.begin, split);
      replicator_->ForgetStream(id, kr.begin);
    }
    shard.RemoveRange(kr.begin);
    for (auto& p : *pieces) shard.AddRange(std::move(p));
    DP_LOG(INFO) << "table '" << shard.spec().name() << "' keys [" << kr.begin
                 << ", " << kr.end << "): split in " << cuts.size() + 1
                 << " at key " << cuts.front() << " (epoch " << epoch << ")";
  }
}

void Dispatcher::MergeHeldRanges(TableId id, TableShard& shard,
                                 const proto::TableMap& table, Epoch epoch) {
  const absl::Status merged = WithReason(
      absl::AbortedError(absl::StrCat("not owner: the range was merged with a "
                                      "neighbour in epoch ",
                                      epoch, "; retry with a fresh map")),
      ErrorReason::kNotOwner);
  for (const proto::RangeAssignment& r : table.ranges()) {
    // Only a range this server holds in sync, listed whole (a restore's
    // ranges start afresh, lost), that it holds as neighbours end to end:
    // they were merged (maybe more than once in the maps it did not see).
    const bool in_sync = r.primary() == self_ ||
                         std::find(r.replicas().begin(), r.replicas().end(),
                                   self_) != r.replicas().end();
    const KeyRange kr{r.begin(), r.end()};
    if (!in_sync || r.lost() || kr.begin >= kr.end ||
        shard.FindExact(kr) != nullptr) {
      continue;
    }
    std::vector<TableShard::Range*> pieces = HeldPiecesOf(shard, kr);
    if (pieces.empty()) continue;
    for (TableShard::Range* p : pieces) {
      // Held steps cannot complete in a piece any more: their workers
      // resend to the merged range.
      AbandonSteps(*p, merged);
    }
    absl::StatusOr<std::unique_ptr<TableShard::Range>> whole =
        MergeRanges(shard, pieces);
    if (!whole.ok()) {
      // Cannot happen (the rows are read back from memory); the range
      // then starts over as a new holder's would.
      DP_LOG(ERROR) << "table '" << shard.spec().name() << "' keys ["
                    << kr.begin << ", " << kr.end
                    << "): cannot merge: " << whole.status();
      continue;
    }
    for (TableShard::Range* p : pieces) {
      const Key begin = p->range().begin;
      if (replicator_ != nullptr) {
        // A new stream for the merged range (SetBackups, in InstallMap).
        replicator_->DropPrimary(id, begin, merged);
        replicator_->ForgetStream(id, begin);
      }
      shard.RemoveRange(begin);
    }
    shard.AddRange(*std::move(whole));
    DP_LOG(INFO) << "table '" << shard.spec().name() << "' keys [" << kr.begin
                 << ", " << kr.end << "): merged from " << pieces.size()
                 << " ranges (epoch " << epoch << ")";
  }
}

void Dispatcher::DropRange(TableId id, TableShard& shard,
                           TableShard::Range& range, const absl::Status& why) {
  const Key begin = range.range().begin;
  if (replicator_ != nullptr) {
    replicator_->DropPrimary(id, begin, why);
    replicator_->ForgetStream(id, begin);
  }
  AbandonSteps(range, why);
  shard.RemoveRange(begin);
}

absl::Status Dispatcher::ApplyMap(const proto::ClusterMap& map) {
  return InstallMap(PrepareMap(map));
}

}  // namespace server_internal
}  // namespace downpour
