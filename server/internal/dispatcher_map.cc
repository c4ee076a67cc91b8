// Dispatcher, part two: applying a new cluster map (see dispatcher.h).
// PrepareMap allocates what a map needs (the slow part) off the data
// thread; InstallMap then creates, promotes, demotes and drops this
// server's ranges and tells the replicator each primary range's backups.
#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "server/internal/dispatcher.h"

namespace downpour {
namespace server_internal {

using Role = TableShard::Range::Role;

namespace {

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

}  // namespace

std::unique_ptr<Dispatcher::PreparedMap> Dispatcher::PrepareMap(
    const proto::ClusterMap& map) const {
  auto prepared = std::make_unique<PreparedMap>();
  prepared->map = map;
  for (const proto::TableMap& table : map.tables()) {
    const TableId id = table.spec().id();
    std::shared_ptr<TableShard> shard;
    {
      absl::MutexLock lock(&mu_);
      auto it = tables_.find(id);
      if (it != tables_.end()) shard = it->second;
    }
    if (shard == nullptr) {
      auto created = TableShard::Create(table.spec(), {}, plugins_,
                                        pin_options_);
      if (!created.ok()) {
        DP_LOG(ERROR) << "cannot serve table '" << table.spec().name()
                      << "': " << created.status();
        if (prepared->status.ok()) prepared->status = created.status();
        continue;
      }
      shard = std::move(*created);
      prepared->new_tables[id] = shard;
    }
    for (const proto::RangeAssignment& r : table.ranges()) {
      const Part part = PartOf(r, self_);
      if (part == Part::kNone) continue;
      const KeyRange range{r.begin(), r.end()};
      // Read without the data thread's help: PrepareMap never runs while
      // InstallMap changes the ranges.
      const TableShard::Range* held = shard->FindExact(range);
      // A demoted primary may hold writes its successor lacks: it starts
      // over from a copy like any new backup.
      if (held == nullptr ||
          (held->role == Role::kPrimary && part == Part::kBackup)) {
        prepared->fresh[{id, r.begin()}] = shard->NewRange(range);
      }
    }
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
  for (uint64_t token : waiters) pull_waiters_.erase(token);
  if (env_ == nullptr) return;
  for (uint64_t token : waiters) {
    DeferredReply d;
    d.reply_token = token;
    d.reply.header.set_server_id(self_);
    d.reply.header.set_status_code(static_cast<int>(why.code()));
    d.reply.header.set_status_message(std::string(why.message()));
    env_->SendDeferred(std::move(d));
  }
}

absl::Status Dispatcher::InstallMap(std::unique_ptr<PreparedMap> prepared) {
  const proto::ClusterMap& map = prepared->map;
  const Epoch epoch = map.epoch();
  absl::flat_hash_map<NodeId, const proto::NodeInfo*> nodes;
  for (const proto::NodeInfo& n : map.nodes()) nodes[n.id()] = &n;
  const absl::Status moved = absl::AbortedError(absl::StrCat(
      "not owner: the range moved away from server ", self_, " in epoch ",
      epoch, "; retry with a fresh map"));
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
      const Key begin = range.range().begin;
      if (replicator_ != nullptr) {
        replicator_->DropPrimary(id, begin, moved);
        replicator_->ForgetStream(id, begin);
      }
      AbandonSteps(range, moved);
      shard->RemoveRange(begin);
    };
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
          part == Part::kBackup) {
        DP_LOG(WARNING) << "table '" << shard->spec().name() << "' keys ["
                        << kr.begin << ", " << kr.end
                        << "): demoted to a backup in epoch " << epoch
                        << "; starting over from a copy";
        drop(*range);
        range = nullptr;
      }
      if (range == nullptr) {
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
                     << ") keys [" << kr.begin << ", " << kr.end << "): "
                     << (part == Part::kPrimary ? "primary" : "backup")
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
      range->backups =
          assignment->replicas_size() + assignment->catching_up_size();
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
        replicator_->SetBackups(id, range, backups, epoch);
      } else {
        replicator_->DropPrimary(id, begin, moved);
      }
    }
  }
  absl::MutexLock lock(&mu_);
  if (epoch > epoch_) epoch_ = epoch;
  return prepared->status;
}

absl::Status Dispatcher::ApplyMap(const proto::ClusterMap& map) {
  return InstallMap(PrepareMap(map));
}

}  // namespace server_internal
}  // namespace downpour
