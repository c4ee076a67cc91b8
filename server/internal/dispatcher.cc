#include "server/internal/dispatcher.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "common/status_macros.h"

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
// be), sparse ranges what `store` holds now (nothing when new).
uint64_t RangeBytes(const TableLayout& layout, KeyRange range,
                    const RangeStore* store) {
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

std::string RangesString(const std::vector<KeyRange>& ranges) {
  if (ranges.empty()) return "none";
  std::string s;
  for (const KeyRange& r : ranges) {
    absl::StrAppend(&s, s.empty() ? "" : " ", "[", r.begin, ", ", r.end, ")");
  }
  return s;
}

// Whether a write of `op` may be retried by its client and is recorded in
// the range's client ledger. Synced (BSP) pushes are idempotent by (rank,
// clock) and task ADDs by (round, task) already.
bool Dedupable(const proto::DataHeader& h, proto::Op op, bool synced) {
  if (h.client_id() == 0 || h.seq() == 0 || synced || h.round() > 0) {
    return false;
  }
  return OpWrites(op) || op == proto::VECTOR;
}

}  // namespace

Dispatcher::Dispatcher(NodeId self, size_t max_message_bytes, BufferPool* pool,
                       const PluginRegistry* plugins,
                       const PinOptions& pin_options, ReplicationEnv* env,
                       uint64_t max_table_bytes)
    : self_(self),
      max_message_bytes_(max_message_bytes),
      pool_(pool),
      plugins_(plugins),
      pin_options_(pin_options),
      env_(env),
      max_table_bytes_(max_table_bytes) {
  if (env_ != nullptr) {
    // Copy chunks of 4 MiB: large enough to move at memory speed, small
    // enough not to hold live writes behind them for long.
    replicator_ = std::make_unique<Replicator>(
        self, env_, std::min<size_t>(max_message_bytes_ / 2, size_t{4} << 20));
  }
}

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
                                        pin_options_);
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
      // A demoted primary may hold writes its successor lacks: it starts
      // over from a copy like any new backup.
      if (held == nullptr ||
          (held->role == Role::kPrimary && part == Part::kBackup)) {
        fresh.push_back(range);
        fresh_bytes = SatAdd(fresh_bytes, RangeBytes(shard->layout(), range,
                                                     nullptr));
      } else {
        held_bytes = SatAdd(held_bytes, RangeBytes(shard->layout(), range,
                                                   held->store.get()));
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
          " bytes): it holds ", committed, " bytes of tables and its limit "
          "is ", max_table_bytes_, " bytes (ps_server --max_table_bytes)")));
      continue;
    }
    bool allocated = true;
    for (const KeyRange& r : fresh) {
      try {
        prepared->fresh[{id, r.begin}] = shard->NewRange(r);
      } catch (const std::bad_alloc&) {
        refuse(absl::ResourceExhaustedError(absl::StrCat(
            "table '", table.spec().name(), "': server ", self_,
            " could not allocate keys [", r.begin, ", ", r.end, ") (",
            fresh_bytes, " bytes for its new ranges)")));
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
      DropRange(id, *shard, range, moved);
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
                 << ") removed from the map in epoch " << epoch
                 << "; dropped";
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

Epoch Dispatcher::epoch() const {
  absl::MutexLock lock(&mu_);
  return epoch_;
}

std::shared_ptr<TableShard> Dispatcher::Lookup(TableId id, Epoch* epoch) const {
  absl::MutexLock lock(&mu_);
  *epoch = epoch_;
  auto it = tables_.find(id);
  return it == tables_.end() ? nullptr : it->second;
}

void Dispatcher::Handle(const IncomingMessage& request, OutgoingReply* reply,
                        std::vector<DeferredReply>* released) {
  const proto::DataHeader& h = request.header;
  const int op = h.op();
  requests_by_op_[op >= 0 && op < 8 ? op : 0].fetch_add(
      1, std::memory_order_relaxed);
  reply->header.set_server_id(self_);
  if (h.replication().kind() != proto::Replication::NONE) {
    HandleReplica(request, reply);
    reply->header.set_server_epoch(epoch());
    return;
  }
  const size_t first_released = released->size();
  absl::StatusOr<Validated> v = Validate(request);
  std::vector<ForwardedWrite> forwards;
  if (v.ok()) {
    const std::vector<double>* done =
        v->deduped ? v->range->clients.Find(h.client_id(), h.seq(),
                                            h.low_seq(), absl::Now())
                   : nullptr;
    if (done != nullptr) {
      // A retry of a write this range applied (e.g. its old primary did,
      // and died before answering): answer it, do not apply it again.
      retries_answered_.fetch_add(1, std::memory_order_relaxed);
      AnswerRetry(*v, request, *done, reply);
      if (replicator_ != nullptr) {
        // Still held for the backups? Then it is answered with the original.
        DeferredReply d{request.reply_token, std::move(*reply)};
        if (replicator_->JoinHeld(h.table_id(), v->range->range().begin,
                                  h.client_id(), h.seq(), &d)) {
          *reply = OutgoingReply();
          reply->deferred = true;
        } else {
          *reply = std::move(d.reply);
        }
      }
    } else if (v->op == proto::VECTOR) {
      std::vector<std::pair<TableShard::Range*, std::vector<double>>> parts;
      ApplyVector(*v, request, reply, &forwards, &parts);
      if (v->deduped) {
        for (auto& [range, partials] : parts) {
          range->clients.Record(h.client_id(), h.seq(), partials, absl::Now());
        }
      }
    } else {
      Apply(*v, request, reply, released, &forwards);
      if (v->deduped) {
        v->range->clients.Record(h.client_id(), h.seq(), {}, absl::Now());
      }
    }
  }
  const Epoch server_epoch = epoch();
  reply->header.set_server_id(self_);
  reply->header.set_server_epoch(server_epoch);
  for (size_t i = first_released; i < released->size(); ++i) {
    OutgoingReply& r = (*released)[i].reply;
    r.header.set_server_id(self_);
    r.header.set_server_epoch(server_epoch);
  }
  if (!v.ok()) {
    reply->deferred = false;
    errors_.fetch_add(1, std::memory_order_relaxed);
    reply->header.set_status_code(static_cast<int>(v.status().code()));
    reply->header.set_status_message(std::string(v.status().message()));
    reply->values = Payload();
    return;
  }
  if (forwards.empty()) return;
  // Hold this reply, and those the request released, until every backup of
  // the ranges it wrote holds the write.
  std::vector<DeferredReply> held;
  for (size_t i = first_released; i < released->size(); ++i) {
    held.push_back(std::move((*released)[i]));
  }
  released->resize(first_released);
  if (!reply->deferred) {
    held.push_back(DeferredReply{request.reply_token, std::move(*reply)});
    *reply = OutgoingReply();
    reply->deferred = true;
  }
  replicator_->Hold(std::move(forwards), std::move(held),
                    v->deduped ? h.client_id() : 0, h.seq());
}

absl::StatusOr<Dispatcher::Validated> Dispatcher::Validate(
    const IncomingMessage& request) const {
  const proto::DataHeader& h = request.header;
  if (h.op() <= proto::OP_UNSPECIFIED || h.op() > proto::VECTOR) {
    return absl::InvalidArgumentError(
        absl::StrCat("unknown operation ", static_cast<int>(h.op())));
  }
  Validated v;
  v.op = h.op();
  Epoch epoch;
  v.shard = Lookup(h.table_id(), &epoch);
  if (v.shard == nullptr) {
    if (h.epoch() > epoch) {
      return absl::UnavailableError(absl::StrCat(
          "server ", self_, " has applied epoch ", epoch,
          " but the request is from epoch ", h.epoch(), "; retry"));
    }
    return absl::NotFoundError(
        absl::StrCat("unknown table id ", h.table_id(), " on server ", self_));
  }
  TableShard& shard = *v.shard;
  const proto::TableSpec& spec = shard.spec();
  if (v.op == proto::VECTOR) return ValidateVector(std::move(v), request);
  if (h.vector_id() >= shard.num_vectors()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "table '", spec.name(), "' has ", shard.num_vectors(),
        " vectors; the request names vector ", h.vector_id()));
  }
  if (h.vector_id() != 0 && (v.op == proto::PUSH || v.op == proto::PUSH_PULL)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "table '", spec.name(), "': push applies the update handler to the "
        "parameters (vector 0), not to vector ", h.vector_id()));
  }
  if (h.round() < 0 || (h.round() > 0 && v.op != proto::ADD)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "round ", h.round(), ": only an ADD may carry a round, and it is > 0"));
  }
  v.vector = h.vector_id();
  const size_t width = shard.width();
  if (h.width() != width) {
    return absl::InvalidArgumentError(
        absl::StrCat("table '", spec.name(), "' has width ", width,
                     ", the request says ", h.width()));
  }
  const KeyRange space = shard.key_space();
  auto not_owner = [&](Key key) {
    return absl::AbortedError(absl::StrCat(
        "not owner: server ", self_, " does not own key ", key, " of table '",
        spec.name(), "' (holds ", RangesString(shard.held()), "), epoch ",
        epoch));
  };
  auto outside = [&](Key key) {
    return absl::OutOfRangeError(
        absl::StrCat("key ", key, " is outside the key space [0, ", space.end,
                     ") of table '", spec.name(), "'"));
  };
  // The range holding `key` if this server serves it as primary.
  auto serving = [&](Key key) -> TableShard::Range* {
    TableShard::Range* r = shard.Find(key);
    return r != nullptr && r->role == Role::kPrimary ? r : nullptr;
  };

  if (h.is_range()) {
    if (!request.keys.empty()) {
      return absl::InvalidArgumentError("a range operation carries no keys");
    }
    if (h.range_begin() >= h.range_end()) {
      return absl::InvalidArgumentError(
          absl::StrCat("empty or inverted range [", h.range_begin(), ", ",
                       h.range_end(), ")"));
    }
    if (h.range_end() > space.end) return outside(h.range_end() - 1);
    v.range = serving(h.range_begin());
    if (v.range == nullptr) return not_owner(h.range_begin());
    if (h.range_end() > v.range->range().end) {
      return not_owner(v.range->range().end);
    }
    v.is_range = true;
    v.begin = h.range_begin();
    v.end = h.range_end();
    v.n = v.end - v.begin;
    if (h.num_keys() != v.n) {
      return absl::InvalidArgumentError(
          absl::StrCat("range [", v.begin, ", ", v.end, ") holds ", v.n,
                       " keys, the header says ", h.num_keys()));
    }
  } else {
    v.keys = request.keys;
    v.n = v.keys.size();
    if (h.num_keys() != v.n) {
      return absl::InvalidArgumentError(absl::StrCat(
          "the keys frame holds ", v.n, " keys, the header says ",
          h.num_keys()));
    }
    if (h.batch_range_end() > 0) {
      // A batch for one named range (a synced sparse push, possibly empty).
      const KeyRange named{h.batch_range_begin(), h.batch_range_end()};
      if (named.begin >= named.end || named.end > space.end) {
        return absl::InvalidArgumentError(
            absl::StrCat("batch names the range [", named.begin, ", ",
                         named.end, ") of table '", spec.name(), "'"));
      }
      v.range = shard.FindExact(named);
      if (v.range == nullptr || v.range->role != Role::kPrimary) {
        return not_owner(named.begin);
      }
    }
    for (Key k : v.keys) {
      if (k >= space.end) return outside(k);
      if (v.range != nullptr && v.range->range().Contains(k)) continue;
      if (h.batch_range_end() > 0) return not_owner(k);
      TableShard::Range* r = serving(k);
      if (r == nullptr) return not_owner(k);
      if (v.range != nullptr) {
        // Every range is replicated and moved on its own, so one request
        // speaks for one range; the client SDK splits batches that way.
        const KeyRange a = v.range->range(), b = r->range();
        return absl::InvalidArgumentError(absl::StrCat(
            "the keys of one request must lie in one range of table '",
            spec.name(), "': key ", v.keys[0], " is in [", a.begin, ", ",
            a.end, "), key ", k, " in [", b.begin, ", ", b.end, ")"));
      }
      v.range = r;
    }
  }
  if (v.range != nullptr && v.range->lost) {
    const KeyRange r = v.range->range();
    return absl::DataLossError(absl::StrCat(
        "table '", spec.name(), "' keys [", r.begin, ", ", r.end,
        ") were lost: no live server held them when they were assigned to "
        "server ", self_, "; restore the table from a checkpoint"));
  }
  if (h.round() > 0 && v.range != nullptr) {
    DP_RETURN_IF_ERROR(v.range->rounds.Check(v.vector, h.round(), spec.name()));
  }
  // n <= 2^64 and width <= 2^20, so compare in 128 bits.
  const unsigned __int128 floats = static_cast<unsigned __int128>(v.n) * width;
  if (floats * sizeof(float) > max_message_bytes_) {
    return absl::ResourceExhaustedError(
        absl::StrCat(v.n, " keys of width ", width,
                     " exceed the message limit of ", max_message_bytes_,
                     " bytes"));
  }
  v.floats = static_cast<size_t>(floats);
  const size_t expected = OpWrites(v.op) ? v.floats : 0;
  if (request.values.size() != expected) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the values frame holds ", request.values.size(), " floats, expected ",
        expected, " (", OpWrites(v.op) ? v.n : 0, " keys x width ", width,
        ") for table '", spec.name(), "'"));
  }
  v.values = request.values.data();
  if ((v.op == proto::PUSH || v.op == proto::PUSH_PULL) &&
      !spec.allow_non_finite()) {
    // A NaN or infinity would poison the row and its handler state (an
    // accumulator keeps it for good): refused, before anything changes.
    for (size_t i = 0; i < request.values.size(); ++i) {
      if (std::isfinite(request.values[i])) continue;
      const size_t row = i / width;
      const Key key = v.is_range ? v.begin + row : v.keys[row];
      return absl::InvalidArgumentError(absl::StrCat(
          "table '", spec.name(), "': the gradient of key ", key,
          " (column ", i % width, ") is ", request.values[i],
          "; pushes must be finite (the table allows non-finite values only "
          "with allow_non_finite)"));
    }
  }

  v.clocked = h.worker_clock() >= 0 && shard.tracked_ranks() > 0;
  if (v.clocked &&
      (h.worker_rank() < 0 || h.worker_rank() >= shard.tracked_ranks())) {
    return absl::InvalidArgumentError(
        absl::StrCat("worker rank ", h.worker_rank(), " outside [0, ",
                     shard.tracked_ranks(), ") of table '", spec.name(), "'"));
  }
  v.synced = v.clocked && spec.sync_workers() > 0 &&
             (v.op == proto::PUSH || v.op == proto::PUSH_PULL);
  // Dense tables aggregate per key range (push, or push-pull answered once
  // the step is applied); sparse tables per key batch, one per worker and
  // range and clock (see TableShard::PushSyncedKeys), push only.
  const bool sparse = spec.kind() == proto::SPARSE;
  if (v.synced &&
      (v.is_range == sparse || (sparse && v.op == proto::PUSH_PULL))) {
    return absl::InvalidArgumentError(absl::StrCat(
        "table '", spec.name(), "' aggregates synchronously: ",
        sparse ? "push key batches, without pull"
               : "push or push-pull key ranges"));
  }
  if (v.synced && v.range != nullptr) {
    // A clock from the future would hold memory, and, once the step it
    // names completed, make every honest push look late. A worker pushes
    // clock c only once the step before it is applied everywhere it pushed
    // (BSP), so it is never more than one clock ahead of a part.
    const KeyRange part = v.is_range ? KeyRange{v.begin, v.end}
                                     : v.range->range();
    auto steps = v.range->steps.find({part.begin, part.end});
    const Clock next = steps == v.range->steps.end()
                           ? 0
                           : steps->second.next_clock();
    if (h.worker_clock() > next + 1) {
      return absl::FailedPreconditionError(absl::StrCat(
          "table '", spec.name(), "' keys [", part.begin, ", ", part.end,
          "): worker ", h.worker_rank(), " pushed clock ", h.worker_clock(),
          ", but the part is at step ", next,
          "; a worker is never more than one clock ahead under BSP"));
    }
  }
  if (v.synced && !v.is_range && v.range == nullptr) {
    // An empty key batch without a named range: it speaks for the one
    // range this server serves, if there is exactly one.
    TableShard::Range* only = nullptr;
    int serving_count = 0;
    for (const auto& [begin, r] : shard.ranges()) {
      if (r->role == Role::kPrimary) {
        only = r.get();
        ++serving_count;
      }
    }
    if (serving_count != 1) {
      return absl::InvalidArgumentError(absl::StrCat(
          "table '", spec.name(), "': an empty synced key batch must name its "
          "range (batch_range_begin/end); server ", self_, " serves ",
          serving_count));
    }
    v.range = only;
  }
  if (v.range != nullptr && v.range->backups > 0 && replicator_ == nullptr &&
      OpWrites(v.op)) {
    return absl::FailedPreconditionError(absl::StrCat(
        "table '", spec.name(), "': the range has backups, and this server "
        "was built without replication"));
  }
  v.deduped = v.range != nullptr && Dedupable(h, v.op, v.synced);
  return v;
}

absl::StatusOr<Dispatcher::Validated> Dispatcher::ValidateVector(
    Validated v, const IncomingMessage& request) const {
  const proto::VectorCommand& cmd = request.header.vector_command();
  const TableShard& shard = *v.shard;
  const std::string& name = shard.spec().name();
  if (!request.keys.empty() || !request.values.empty()) {
    return absl::InvalidArgumentError(
        "a vector command carries no keys and no values");
  }
  if (shard.spec().kind() != proto::DENSE) {
    return absl::InvalidArgumentError(absl::StrCat(
        "table '", name, "' is sparse: vector commands need a dense table"));
  }
  const Key space_end = shard.key_space().end;
  if (cmd.end() != 0 && (cmd.begin() >= cmd.end() || cmd.end() > space_end)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "vector command range [", cmd.begin(), ", ", cmd.end(),
        ") is empty or outside [0, ", space_end, ") of table '", name, "'"));
  }
  DP_ASSIGN_OR_RETURN(VectorKernel kernel,
                      VectorKernel::Create(cmd, shard.num_vectors()),
                      "table '", name, "'");
  v.kernel = std::move(kernel);
  const Key lo = cmd.begin(), hi = cmd.end() == 0 ? space_end : cmd.end();
  int overlapped = 0;
  for (const auto& [begin, r] : shard.ranges()) {
    const KeyRange kr = r->range();
    if (r->role != Role::kPrimary || kr.end <= lo || kr.begin >= hi) continue;
    if (r->lost) {
      return absl::DataLossError(absl::StrCat(
          "table '", name, "' keys [", kr.begin, ", ", kr.end,
          ") were lost: no live server held them when they were assigned to "
          "server ", self_, "; restore the table from a checkpoint"));
    }
    if (r->backups > 0 && replicator_ == nullptr) {
      return absl::FailedPreconditionError(absl::StrCat(
          "table '", name, "': the range has backups, and this server was "
          "built without replication"));
    }
    v.range = r.get();
    ++overlapped;
  }
  // A command for one range (as the SDK sends them) is recorded in that
  // range's client ledger; one spanning several is not retried safely.
  if (overlapped != 1) v.range = nullptr;
  v.deduped = v.range != nullptr && Dedupable(request.header, v.op, false);
  return v;
}

bool Dispatcher::Replicated(const Validated& v) const {
  return replicator_ != nullptr && v.range != nullptr &&
         replicator_->HasBackups(v.shard->spec().id(), v.range->range().begin);
}

ForwardedWrite Dispatcher::ForwardOf(const Validated& v,
                                     const IncomingMessage& request) {
  const proto::DataHeader& in = request.header;
  ForwardedWrite f;
  f.range = v.range;
  proto::DataHeader& h = f.header;
  h.set_op(v.op == proto::PUSH_PULL ? proto::PUSH : v.op);
  h.set_table_id(in.table_id());
  h.set_epoch(epoch());
  h.set_is_range(v.is_range);
  h.set_range_begin(v.begin);
  h.set_range_end(v.end);
  h.set_num_keys(v.n);
  h.set_width(in.width());
  h.set_vector_id(v.vector);
  h.set_round(in.round());
  h.set_task_id(in.task_id());
  h.set_client_id(in.client_id());
  h.set_seq(in.seq());
  std::shared_ptr<const RetainedRequest> frames = env_->Retain(request);
  f.keys = frames->keys;
  f.values = frames->values;
  f.owner = std::move(frames);
  return f;
}

void Dispatcher::Apply(const Validated& v, const IncomingMessage& request,
                       OutgoingReply* reply,
                       std::vector<DeferredReply>* released,
                       std::vector<ForwardedWrite>* forwards) {
  const proto::DataHeader& h = request.header;
  TableShard& shard = *v.shard;
  reply->header.set_num_keys(v.n);
  reply->header.set_width(shard.width());
  if (h.round() > 0 && v.n > 0 &&
      !v.range->rounds.FirstInRound(v.vector, h.round(), h.task_id(),
                                    v.is_range ? v.begin : v.keys[0])) {
    // A backup copy's or a late task's gradient: acknowledged, not applied.
    shard.CountDroppedTaskAdd();
    reply->header.set_discarded(true);
    return;
  }
  if (v.synced) return ApplySynced(v, request, reply, released, forwards);
  RangeStore& store = *v.range->store;
  const float* in = v.values;
  switch (v.op) {
    case proto::PUT:
      v.is_range ? store.PutRange(v.begin, v.end, in, v.vector)
                 : store.Put(v.keys, in, v.vector);
      break;
    case proto::ADD:
      v.is_range ? store.AddRange(v.begin, v.end, in, v.vector)
                 : store.Add(v.keys, in, v.vector);
      break;
    case proto::PUSH:
    case proto::PUSH_PULL:
      v.is_range ? store.PushRange(v.begin, v.end, in) : store.Push(v.keys, in);
      break;
    default:
      break;
  }
  const bool replicated = OpWrites(v.op) && Replicated(v);
  if (replicated) forwards->push_back(ForwardOf(v, request));
  if (v.clocked && OpWrites(v.op)) {
    shard.RecordApplied(h.worker_rank(), h.worker_clock());
  }
  if (v.clocked && OpReads(v.op)) {
    reply->header.set_staleness(shard.ObservePull(h.worker_clock()));
  }
  if (OpReads(v.op)) {
    if (v.is_range) {
      // A reply held for the backups is copied: pinned rows would make the
      // next write to them wait for the backups too.
      reply->values = ReadRange(store, v.begin, v.end, v.floats, v.vector,
                                /*may_pin=*/!replicated);
    } else {
      Buffer out = pool_->Acquire(v.floats * sizeof(float));
      store.Get(v.keys, reinterpret_cast<float*>(out.data()), v.vector);
      reply->values = Payload::Own(std::move(out));
    }
  }
}

void Dispatcher::ApplySynced(const Validated& v, const IncomingMessage& request,
                             OutgoingReply* reply,
                             std::vector<DeferredReply>* released,
                             std::vector<ForwardedWrite>* forwards) {
  const proto::DataHeader& h = request.header;
  TableShard& shard = *v.shard;
  const bool pull = v.op == proto::PUSH_PULL;
  const size_t first_waiter = waiters_.size();
  // Every synced push waits for its step: acknowledging a held gradient
  // would let it be lost with this server before the step applies it.
  const TableShard::SyncOutcome outcome =
      v.is_range
          ? shard.PushSynced(*v.range, v.begin, v.end, h.worker_rank(),
                             h.worker_clock(), v.values, request.reply_token,
                             &waiters_)
          : shard.PushSyncedKeys(*v.range, v.keys, h.worker_rank(),
                                 h.worker_clock(), v.values,
                                 request.reply_token, &waiters_,
                                 &applied_keys_);
  reply->header.set_discarded(outcome.result ==
                              TableShard::SyncResult::kDiscarded);
  if (outcome.result == TableShard::SyncResult::kHeld) {
    reply->deferred = true;
    if (pull) pull_waiters_.insert(request.reply_token);
    return;
  }
  const bool replicated = outcome.result == TableShard::SyncResult::kApplied &&
                          Replicated(v);
  if (replicated) {
    // The step as the backups apply it: one push of what the handler
    // applied (the ranks' mean), marking the clock applied.
    ForwardedWrite f;
    f.range = v.range;
    f.step_clock = h.worker_clock();
    proto::DataHeader& fh = f.header;
    fh.set_op(proto::PUSH);
    fh.set_table_id(h.table_id());
    fh.set_epoch(epoch());
    fh.set_width(shard.width());
    if (v.is_range && outcome.applied == v.values) {
      // One rank: the request's own gradient.
      std::shared_ptr<const RetainedRequest> frames = env_->Retain(request);
      f.values = frames->values;
      f.owner = std::move(frames);
    } else {
      const size_t floats =
          v.is_range ? v.floats : applied_keys_.size() * shard.width();
      auto copy = std::make_shared<std::pair<Buffer, Buffer>>(
          pool_->Acquire(floats * sizeof(float)),
          pool_->Acquire(v.is_range ? 0 : applied_keys_.size() * sizeof(Key)));
      std::memcpy(copy->first.data(), outcome.applied, floats * sizeof(float));
      f.values = absl::MakeConstSpan(
          reinterpret_cast<const float*>(copy->first.data()), floats);
      if (!v.is_range) {
        std::memcpy(copy->second.data(), applied_keys_.data(),
                    applied_keys_.size() * sizeof(Key));
        f.keys = absl::MakeConstSpan(
            reinterpret_cast<const Key*>(copy->second.data()),
            applied_keys_.size());
      }
      f.owner = std::move(copy);
    }
    fh.set_is_range(v.is_range);
    fh.set_range_begin(v.begin);
    fh.set_range_end(v.end);
    fh.set_num_keys(v.is_range ? v.n : f.keys.size());
    forwards->push_back(std::move(f));
  }
  // The step is applied (or was, for a late push): the values are what a
  // pull at the next clock reads, for this request if it asks and for every
  // PushPull that waited for the step (whatever op completed it).
  const Clock next = h.worker_clock() + 1;
  RangeStore& store = *v.range->store;
  if (pull) {
    reply->header.set_staleness(shard.ObservePull(next));
    reply->values =
        ReadRange(store, v.begin, v.end, v.floats, 0, !replicated);
  }
  for (size_t i = first_waiter; i < waiters_.size(); ++i) {
    DeferredReply d;
    d.reply_token = waiters_[i];
    d.reply.header.set_num_keys(v.n);
    d.reply.header.set_width(shard.width());
    // A PushPull waiter gets the values, whatever op completed the step.
    if (pull_waiters_.erase(d.reply_token) > 0) {
      d.reply.header.set_staleness(shard.ObservePull(next));
      d.reply.values =
          ReadRange(store, v.begin, v.end, v.floats, 0, !replicated);
    }
    released->push_back(std::move(d));
  }
  waiters_.resize(first_waiter);
}

void Dispatcher::ApplyVector(
    const Validated& v, const IncomingMessage& request, OutgoingReply* reply,
    std::vector<ForwardedWrite>* forwards,
    std::vector<std::pair<TableShard::Range*, std::vector<double>>>*
        per_range) {
  const proto::VectorCommand& cmd = request.header.vector_command();
  const Key lo = cmd.begin();
  const Key hi = cmd.end() == 0 ? v.shard->key_space().end : cmd.end();
  const bool writes_params =
      cmd.update() != proto::VectorCommand::NONE && cmd.dst() == 0;
  const bool writes = cmd.update() != proto::VectorCommand::NONE;
  std::vector<double> partials(v.kernel->num_dots(), 0.0);
  // Served ranges in key order, each summed on its own and then added, so
  // the answer is the same however the ranges are spread over servers.
  for (const auto& [begin, range] : v.shard->ranges()) {
    const KeyRange r = range->range();
    if (range->role != Role::kPrimary || r.end <= lo || r.begin >= hi) {
      continue;
    }
    std::vector<double> part(v.kernel->num_dots(), 0.0);
    range->store->RunVector(lo, hi, *v.kernel, writes_params, part.data());
    if (cmd.update() == proto::VectorCommand::ZERO && cmd.open_round() > 0) {
      range->rounds.Open(cmd.dst(), cmd.open_round());
    }
    for (size_t i = 0; i < part.size(); ++i) partials[i] += part[i];
    if (writes && replicator_ != nullptr &&
        replicator_->HasBackups(v.shard->spec().id(), r.begin)) {
      ForwardedWrite f;
      f.range = range.get();
      f.header.set_op(proto::VECTOR);
      f.header.set_table_id(request.header.table_id());
      f.header.set_epoch(epoch());
      f.header.set_client_id(request.header.client_id());
      f.header.set_seq(request.header.seq());
      proto::VectorCommand* c = f.header.mutable_vector_command();
      *c = cmd;
      c->set_begin(std::max(lo, r.begin));
      c->set_end(std::min(hi, r.end));
      forwards->push_back(std::move(f));
    }
    per_range->push_back({range.get(), std::move(part)});
  }
  for (double p : partials) reply->header.add_scalars(p);
}

void Dispatcher::AnswerRetry(const Validated& v, const IncomingMessage& request,
                             const std::vector<double>& scalars,
                             OutgoingReply* reply) {
  reply->header.set_num_keys(v.n);
  reply->header.set_width(v.shard->width());
  for (double d : scalars) reply->header.add_scalars(d);
  if (v.op == proto::PUSH_PULL) {
    // The values now: the write is in them, and later ones may be.
    RangeStore& store = *v.range->store;
    if (v.is_range) {
      reply->values = ReadRange(store, v.begin, v.end, v.floats, 0, false);
    } else {
      Buffer out = pool_->Acquire(v.floats * sizeof(float));
      store.Get(v.keys, reinterpret_cast<float*>(out.data()));
      reply->values = Payload::Own(std::move(out));
    }
  }
}

void Dispatcher::HandleReplica(const IncomingMessage& request,
                               OutgoingReply* reply) {
  const proto::DataHeader& h = request.header;
  const proto::Replication& r = h.replication();
  auto fail = [&](const absl::Status& s) {
    errors_.fetch_add(1, std::memory_order_relaxed);
    reply->header.set_status_code(static_cast<int>(s.code()));
    reply->header.set_status_message(std::string(s.message()));
  };
  Epoch epoch;
  std::shared_ptr<TableShard> shard = Lookup(h.table_id(), &epoch);
  const KeyRange kr{r.range_begin(), r.range_end()};
  TableShard::Range* range =
      shard != nullptr ? shard->FindExact(kr) : nullptr;
  if (range == nullptr || range->role != Role::kBackup ||
      range->primary != h.sender()) {
    if (h.epoch() > epoch) {
      return fail(absl::UnavailableError(absl::StrCat(
          "server ", self_, " has applied epoch ", epoch,
          " but the primary is at ", h.epoch(), "; resend")));
    }
    return fail(absl::AbortedError(absl::StrCat(
        "server ", self_, " is not a backup of node ", h.sender(),
        " for table ", h.table_id(), " keys [", kr.begin, ", ", kr.end,
        ") in epoch ", epoch)));
  }
  if (replicator_ == nullptr) {
    return fail(absl::FailedPreconditionError("replication is off here"));
  }
  absl::StatusOr<bool> apply = replicator_->Accept(h.table_id(), kr.begin, r);
  if (!apply.ok()) return fail(apply.status());
  if (*apply) {
    absl::Status s = ApplyReplica(*shard, *range, request);
    if (!s.ok()) {
      DP_LOG(ERROR) << "cannot apply replication message " << r.stream_seq()
                    << " from node " << h.sender() << ": " << s;
      return fail(s);
    }
    replicator_->Applied(h.table_id(), kr.begin, r);
    replica_writes_.fetch_add(1, std::memory_order_relaxed);
  }
}

absl::Status Dispatcher::ApplyReplica(TableShard& shard,
                                      TableShard::Range& range,
                                      const IncomingMessage& request) {
  const proto::DataHeader& h = request.header;
  const proto::Replication& r = h.replication();
  const TableLayout& layout = shard.layout();
  const KeyRange kr = range.range();
  switch (r.kind()) {
    case proto::Replication::COPY_BEGIN: {
      // The primary's ledgers; its rows follow. Sparse rows this server
      // holds from an earlier copy may be gone on the primary: start empty.
      if (!layout.dense) {
        range.store = std::make_unique<RangeStore>(&layout, kr);
      }
      const proto::RangeLedgers& l = r.ledgers();
      range.steps.clear();
      for (const proto::RangeLedgers::Step& step : l.steps()) {
        range.StepsFor({step.begin(), step.end()}).Reset(step.next_clock());
      }
      std::vector<RoundLedger::Entry> rounds;
      for (const proto::RangeLedgers::Round& round : l.rounds()) {
        RoundLedger::Entry e{round.vector(), round.open(), {}};
        for (int i = 0; i + 1 < round.tasks_size(); i += 2) {
          e.applied.push_back({round.tasks(i), round.tasks(i + 1)});
        }
        rounds.push_back(std::move(e));
      }
      range.rounds.Import(rounds);
      range.clients.Import(l, absl::Now());
      return absl::OkStatus();
    }
    case proto::Replication::COPY_ROWS: {
      RowChunkView c;
      c.first_key = r.chunk().first_key();
      c.count = r.chunk().count();
      c.keys = request.keys;
      c.has_state = r.chunk().has_state();
      c.vectors = absl::MakeConstSpan(r.chunk().vectors().data(),
                                      r.chunk().vectors_size());
      c.data = request.values;
      return range.store->ImportRows(c);
    }
    case proto::Replication::COPY_END:
      return absl::OkStatus();
    case proto::Replication::WRITE:
      break;
    default:
      return absl::InvalidArgumentError(absl::StrCat(
          "unknown replication message kind ", static_cast<int>(r.kind())));
  }
  // A write the primary applied. The primary checked it; these checks only
  // keep a malformed message from touching memory it should not.
  RangeStore& store = *range.store;
  const proto::Op op = h.op();
  if (op == proto::VECTOR) {
    const proto::VectorCommand& cmd = h.vector_command();
    DP_ASSIGN_OR_RETURN(VectorKernel kernel,
                        VectorKernel::Create(cmd, layout.num_vectors));
    std::vector<double> partials(kernel.num_dots(), 0.0);
    const Key lo = std::max<Key>(cmd.begin(), kr.begin);
    const Key hi = std::min<Key>(cmd.end() == 0 ? kr.end : cmd.end(), kr.end);
    store.RunVector(lo, hi, kernel,
                    cmd.update() != proto::VectorCommand::NONE && cmd.dst() == 0,
                    partials.data());
    if (cmd.update() == proto::VectorCommand::ZERO && cmd.open_round() > 0) {
      range.rounds.Open(cmd.dst(), cmd.open_round());
    }
    if (h.client_id() != 0 && h.seq() != 0) {
      range.clients.Record(h.client_id(), h.seq(), partials, absl::Now());
    }
    return absl::OkStatus();
  }
  if (op != proto::PUT && op != proto::ADD && op != proto::PUSH) {
    return absl::InvalidArgumentError(absl::StrCat(
        "a replicated write with operation ", static_cast<int>(op)));
  }
  if (h.width() != layout.width || h.vector_id() >= layout.num_vectors ||
      (op == proto::PUSH && h.vector_id() != 0)) {
    return absl::InvalidArgumentError("a replicated write of the wrong shape");
  }
  uint64_t n;
  if (h.is_range()) {
    if (h.range_begin() >= h.range_end() || h.range_begin() < kr.begin ||
        h.range_end() > kr.end) {
      return absl::InvalidArgumentError(
          "a replicated range write outside its range");
    }
    n = h.range_end() - h.range_begin();
  } else {
    for (Key k : request.keys) {
      if (!kr.Contains(k)) {
        return absl::InvalidArgumentError(
            absl::StrCat("a replicated write of key ", k, " outside [",
                         kr.begin, ", ", kr.end, ")"));
      }
    }
    n = request.keys.size();
  }
  if (request.values.size() != n * layout.width) {
    return absl::InvalidArgumentError(
        "a replicated write whose values do not match its keys");
  }
  if (h.round() > 0 && n > 0) {
    range.rounds.FirstInRound(h.vector_id(), h.round(), h.task_id(),
                              h.is_range() ? h.range_begin() : request.keys[0]);
  }
  const float* in = request.values.data();
  const uint32_t vec = h.vector_id();
  const Key b = h.range_begin(), e = h.range_end();
  switch (op) {
    case proto::PUT:
      h.is_range() ? store.PutRange(b, e, in, vec)
                   : store.Put(request.keys, in, vec);
      break;
    case proto::ADD:
      h.is_range() ? store.AddRange(b, e, in, vec)
                   : store.Add(request.keys, in, vec);
      break;
    default:
      h.is_range() ? store.PushRange(b, e, in) : store.Push(request.keys, in);
      break;
  }
  if (h.client_id() != 0 && h.seq() != 0) {
    range.clients.Record(h.client_id(), h.seq(), {}, absl::Now());
  }
  if (r.step_clock() >= 0) {
    // The part the primary aggregated: the pushed key range, or the whole
    // range for a key batch.
    const KeyRange part = h.is_range() ? KeyRange{h.range_begin(), h.range_end()}
                                       : kr;
    range.StepsFor(part).set_next_clock(r.step_clock() + 1);
  }
  return absl::OkStatus();
}

Payload Dispatcher::ReadRange(RangeStore& store, Key begin, Key end,
                              size_t floats, uint32_t vector, bool may_pin) {
  if (vector == 0 && may_pin) {
    if (auto pinned = store.PinRows(begin, end)) {
      // Sent from the table's memory: copying large replies into a send
      // buffer kept one-server pulls under 70% of raw ZeroMQ
      // (docs/BENCHMARKS.md).
      return Payload::Borrow(pinned->data, pinned->bytes,
                             std::move(pinned->release));
    }
  }
  Buffer out = pool_->Acquire(floats * sizeof(float));
  store.GetRange(begin, end, reinterpret_cast<float*>(out.data()), vector);
  return Payload::Own(std::move(out));
}

void Dispatcher::FillStats(proto::ServerStats* stats) const {
  stats->set_node_id(self_);
  for (int op = proto::PUT; op <= proto::VECTOR; ++op) {
    (*stats->mutable_requests_by_op())[proto::Op_Name(
        static_cast<proto::Op>(op))] = requests_by_op_[op].load();
  }
  stats->set_errors(errors_.load());
  absl::MutexLock lock(&mu_);
  stats->set_epoch(epoch_);
  for (const auto& [id, shard] : tables_) {
    proto::TableStats* t = stats->add_tables();
    t->set_name(shard->spec().name());
    t->set_id(id);
    t->set_rows(shard->rows());
    t->set_value_bytes(shard->value_bytes());
    t->set_state_bytes(shard->state_bytes());
    t->set_allocated_bytes(shard->allocated_bytes());
    t->set_max_staleness(shard->max_staleness());
    t->set_tracked_pulls(shard->tracked_pulls());
    t->set_discarded_pushes(shard->discarded_pushes());
    t->set_aggregated_steps(shard->aggregated_steps());
    t->set_dropped_task_adds(shard->dropped_task_adds());
    t->set_zero_copy_replies(shard->zero_copy_replies());
    t->set_pin_waits(shard->pin_waits());
    t->set_pin_copies(shard->pin_copies());
    t->set_pinned_replies(shard->pinned_replies());
  }
}

}  // namespace server_internal
}  // namespace downpour
