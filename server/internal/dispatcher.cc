#include "server/internal/dispatcher.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/error_reason.h"
#include "common/logging.h"
#include "common/status_macros.h"
#include "server/internal/replica_apply.h"

namespace downpour {
namespace server_internal {

// Dispatcher, part one: executing data-plane requests (see dispatcher.h).
// Their checks are in dispatcher_validate.cc, the map's application in
// dispatcher_map.cc, a backup's application of what its primary forwards
// in replica_apply.cc.

using Role = TableShard::Range::Role;

namespace {

// A dense batch goes run by run (k, k + 1, ...) when its runs average at
// least this many keys: one range call per run is a pass over contiguous
// rows, where a key at a time costs a handler call per row.
constexpr size_t kMinRunsPerKey = 16;

// The number of runs of consecutive keys in `keys` if they average at
// least `min_run` keys each, else 0 (stops counting as soon as they
// cannot).
size_t CountRuns(absl::Span<const Key> keys, size_t min_run) {
  if (keys.empty()) return 0;
  const size_t most = keys.size() / min_run;
  size_t runs = 1;
  for (size_t i = 1; i < keys.size(); ++i) {
    runs += keys[i] != keys[i - 1] + 1;
    if (runs > most) return 0;
  }
  return runs;
}

// Calls fn(offset, begin, end) for each run [begin, end) of consecutive
// keys, in order; offset: the run's first index in `keys`.
template <typename Fn>
void ForEachRun(absl::Span<const Key> keys, Fn fn) {
  size_t start = 0;
  for (size_t i = 1; i <= keys.size(); ++i) {
    if (i == keys.size() || keys[i] != keys[i - 1] + 1) {
      fn(start, keys[start], keys[i - 1] + 1);
      start = i;
    }
  }
}

// Reads the rows of a key batch into `out`: a dense table's runs of
// consecutive keys as ranges, and sorted keys that cover at least a
// quarter of their span (every other key, say) by reading the span in one
// pass into a buffer from `pool` and picking their rows from it, in order
// and at memory speed, instead of a row lookup per key.
absl::Status ReadBatch(BufferPool* pool, bool dense, absl::Span<const Key> keys,
                       uint32_t vector, size_t width, RangeStore& store,
                       float* out) {
  // A sparse read may meet a failing cold tier: that is its error.
  if (!dense) return store.Get(keys, out, vector);
  if (CountRuns(keys, kMinRunsPerKey) > 0) {
    ForEachRun(keys, [&](size_t at, Key begin, Key end) {
      store.GetRange(begin, end, out + at * width, vector).IgnoreError();
    });
    return absl::OkStatus();
  }
  const Key lo = keys.empty() ? 0 : keys.front();
  const Key hi = keys.empty() ? 0 : keys.back();
  if (keys.size() >= 1024 && hi - lo < 4 * keys.size() &&
      std::is_sorted(keys.begin(), keys.end())) {
    Buffer span = pool->Acquire((hi - lo + 1) * width * sizeof(float));
    const float* rows = reinterpret_cast<const float*>(span.data());
    store.GetRange(lo, hi + 1, reinterpret_cast<float*>(span.data()), vector)
        .IgnoreError();  // dense reads do not fail
    if (width == 1) {
      for (size_t i = 0; i < keys.size(); ++i) out[i] = rows[keys[i] - lo];
    } else {
      for (size_t i = 0; i < keys.size(); ++i) {
        std::memcpy(out + i * width, rows + (keys[i] - lo) * width,
                    width * sizeof(float));
      }
    }
    return absl::OkStatus();
  }
  return store.Get(keys, out, vector);
}

// A write of a dense key batch whose keys come in long runs (k, k + 1,
// ...): applied as one range write per run, the same as key by key (a
// handler applied to a run of rows equals it applied row by row). False,
// changing nothing, when the runs are too short for it to pay.
bool ApplyDenseRuns(proto::Op op, absl::Span<const Key> keys,
                    const float* values, uint32_t vector, size_t width,
                    RangeStore& store) {
  if (CountRuns(keys, kMinRunsPerKey) == 0) return false;
  ForEachRun(keys, [&](size_t at, Key begin, Key end) {
    const float* in = values + at * width;
    switch (op) {
      case proto::PUT:
        store.PutRange(begin, end, in, vector);
        break;
      case proto::ADD:
        store.AddRange(begin, end, in, vector);
        break;
      case proto::PUSH:
      case proto::PUSH_PULL:
        store.PushRange(begin, end, in);
        break;
      default:
        break;
    }
  });
  return true;
}

}  // namespace

Dispatcher::Dispatcher(NodeId self, size_t max_message_bytes, BufferPool* pool,
                       const PluginRegistry* plugins,
                       const PinOptions& pin_options, ReplicationEnv* env,
                       uint64_t max_table_bytes, storage::ColdStore* cold_store)
    : self_(self),
      max_message_bytes_(max_message_bytes),
      pool_(pool),
      plugins_(plugins),
      pin_options_(pin_options),
      env_(env),
      max_table_bytes_(max_table_bytes),
      cold_store_(cold_store) {
  if (env_ != nullptr) {
    // Copy chunks of 4 MiB: large enough to move at memory speed, small
    // enough not to hold live writes behind them for long.
    replicator_ = std::make_unique<Replicator>(
        self, env_, std::min<size_t>(max_message_bytes_ / 2, size_t{4} << 20));
  }
}

std::vector<std::pair<TableId, std::shared_ptr<TableShard>>>
Dispatcher::Tables() const {
  absl::MutexLock lock(&mu_);
  return {tables_.begin(), tables_.end()};
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
    if (v->range != nullptr) {
      // A key of the request, which one chosen by the count, so that a
      // batch's keys all get their chance.
      const uint64_t pick = v->range->served_requests * 0x9E3779B97F4A7C15ull;
      if (v->n > 0) {
        v->range->SampleKey(v->is_range ? v->begin + pick % v->n
                                        : v->keys[pick % v->n]);
      }
      ++v->range->served_requests;
      v->range->served_keys += v->n;
    }
    const std::vector<double>* done =
        v->deduped ? v->range->clients.Find(h.client_id(), h.seq(), h.low_seq(),
                                            absl::Now())
                   : nullptr;
    if (done != nullptr) {
      // A retry of a write this range applied (e.g. its old primary did,
      // and died before answering): answer it, do not apply it again.
      retries_answered_.fetch_add(1, std::memory_order_relaxed);
      DP_VLOG(2) << "table " << h.table_id() << " keys ["
                 << v->range->range().begin << ", " << v->range->range().end
                 << "): client " << h.client_id() << " seq " << h.seq()
                 << " (op " << proto::Op_Name(v->op) << ", round " << h.round()
                 << ", task " << h.task_id()
                 << ") is a retry: answered from the ledger";
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
      absl::Status applied = Apply(*v, request, reply, released, &forwards);
      if (!applied.ok()) {
        // Refused whole (a bounded table at its cap) or a read that failed:
        // not recorded, so that a retry is tried again.
        errors_.fetch_add(1, std::memory_order_relaxed);
        reply->deferred = false;
        reply->values = Payload();
        SetReplyStatus(Annotate(applied, absl::StrCat("server ", self_)),
                       &reply->header);
      } else if (v->deduped) {
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
    SetReplyStatus(v.status(), &reply->header);
    reply->values = Payload();
    return;
  }
  if (forwards.empty()) {
    // A task's ADD dropped as a repeat in its round vouches for the copy
    // applied before it (a backup task's, or the same worker's resend): the
    // coordinator counts the task added on this answer. Answered before the
    // backups hold that copy, a failover right after would lose the
    // gradient (tests/sandblaster_failover_test.cc once ended 1e-3 off).
    if (replicator_ != nullptr && h.round() > 0 && reply->header.discarded() &&
        !reply->deferred && v->range != nullptr) {
      DeferredReply d{request.reply_token, std::move(*reply)};
      if (replicator_->HoldBehind(h.table_id(), v->range->range().begin, &d)) {
        *reply = OutgoingReply();
        reply->deferred = true;
      } else {
        *reply = std::move(d.reply);
      }
    }
    return;
  }
  if (!OpWrites(v->op) && v->op != proto::VECTOR) {
    // A read that moved rows between memory and the cold tier: the backups
    // follow, but the reader need not wait (nothing it wrote is at stake).
    replicator_->Hold(std::move(forwards), {}, 0, 0);
    return;
  }
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

bool Dispatcher::Replicated(const Validated& v) const {
  return v.range != nullptr && Replicated(*v.shard, *v.range);
}

bool Dispatcher::Replicated(const TableShard& shard,
                            const TableShard::Range& range) const {
  return replicator_ != nullptr &&
         replicator_->HasBackups(shard.spec().id(), range.range().begin);
}

namespace {
SparseRows::Write WriteOf(proto::Op op) {
  switch (op) {
    case proto::PUT:
      return SparseRows::Write::kPut;
    case proto::ADD:
      return SparseRows::Write::kAdd;
    default:
      return SparseRows::Write::kPush;
  }
}
}  // namespace

void Dispatcher::ForwardRoom(const TableShard& shard, TableShard::Range* range,
                             const SparseRows::Room& room,
                             std::vector<ForwardedWrite>* forwards) {
  if ((room.gone.empty() && room.back.empty()) || !Replicated(shard, *range)) {
    return;
  }
  auto header = [&](proto::Replication::Kind kind) {
    proto::DataHeader h;
    h.set_op(proto::PUT);
    h.set_table_id(shard.spec().id());
    h.set_epoch(epoch());
    h.set_width(shard.width());
    h.mutable_replication()->set_kind(kind);
    return h;
  };
  if (!room.gone.empty()) {
    // The rows that left memory, before the write that needed the room.
    auto keys = std::make_shared<std::vector<Key>>(room.gone);
    ForwardedWrite f;
    f.range = range;
    f.header = header(proto::Replication::EVICT);
    f.header.set_num_keys(keys->size());
    f.keys = *keys;
    f.owner = std::move(keys);
    forwards->push_back(std::move(f));
  }
  if (!room.back.empty()) {
    // Rows brought back from the cold tier travel with their values: the
    // backups then hold the same rows in memory as this primary.
    struct Rows {
      std::vector<Key> keys;
      std::vector<float> data;
    };
    auto rows = std::make_shared<Rows>();
    rows->keys = room.back;
    range->store->sparse()->CopyRows(rows->keys, &rows->data);
    ForwardedWrite f;
    f.range = range;
    f.header = header(proto::Replication::COPY_ROWS);
    f.header.set_num_keys(rows->keys.size());
    proto::RowChunkInfo* c = f.header.mutable_replication()->mutable_chunk();
    c->set_count(rows->keys.size());
    c->set_has_state(shard.layout().state_width > 0);
    c->set_kind(proto::RowChunkInfo::ROWS);
    f.keys = rows->keys;
    f.values = rows->data;
    f.owner = std::move(rows);
    forwards->push_back(std::move(f));
  }
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
  // The backups count the push for staleness as this server did.
  h.set_worker_clock(v.clocked ? in.worker_clock() : -1);
  h.set_worker_rank(v.clocked ? in.worker_rank() : 0);
  std::shared_ptr<const RetainedRequest> frames = env_->Retain(request);
  f.keys = frames->keys;
  f.values = frames->values;
  f.owner = std::move(frames);
  return f;
}

absl::Status Dispatcher::Apply(const Validated& v,
                               const IncomingMessage& request,
                               OutgoingReply* reply,
                               std::vector<DeferredReply>* released,
                               std::vector<ForwardedWrite>* forwards) {
  const proto::DataHeader& h = request.header;
  TableShard& shard = *v.shard;
  reply->header.set_num_keys(v.n);
  reply->header.set_width(shard.width());
  if (h.round() > 0 && v.n > 0) {
    const Key first = v.is_range ? v.begin : v.keys[0];
    const bool apply =
        v.range->rounds.FirstInRound(v.vector, h.round(), h.task_id(), first);
    DP_VLOG(2) << "table " << h.table_id() << " keys ["
               << v.range->range().begin << ", " << v.range->range().end
               << "): task " << h.task_id() << " of round " << h.round()
               << " (vector " << v.vector << ", first key " << first
               << ", client " << h.client_id() << " seq " << h.seq() << ") "
               << (apply ? "applied" : "dropped: a repeat or late");
    if (!apply) {
      // A backup copy's or a late task's gradient: acknowledged, not applied.
      shard.CountDroppedTaskAdd();
      reply->header.set_discarded(true);
      return absl::OkStatus();
    }
  }
  if (v.range != nullptr && v.clocked) {
    if (SparseRows* rows = v.range->store->sparse()) {
      rows->ObserveClock(h.worker_clock());
    }
  }
  if (v.synced) return ApplySynced(v, request, reply, released, forwards);
  if (v.range == nullptr) {
    // An empty key batch (it names no range): nothing to read or write.
    // Found by the dispatcher fuzzer: it once dereferenced no range here.
    return absl::OkStatus();
  }
  RangeStore& store = *v.range->store;
  if (OpWrites(v.op) && store.sparse() != nullptr &&
      store.sparse()->bounded()) {
    // A bounded table makes room first; the backups hear what moved before
    // they hear the write.
    room_.clear();
    const absl::Status made =
        v.is_range
            ? shard.PrepareWriteRange(*v.range, v.begin, v.end, WriteOf(v.op),
                                      -1, &room_)
            : shard.PrepareWrite(*v.range, v.keys, WriteOf(v.op), -1, &room_);
    ForwardRoom(shard, v.range, room_, forwards);
    if (!made.ok()) return made;
  }
  if (OpReads(v.op) && !OpWrites(v.op) && store.sparse() != nullptr &&
      store.sparse()->bounds().cold) {
    // Cold rows read come back into memory ("on access"), so that the push
    // that usually follows finds them there. Best effort: a read never
    // fails for want of room, it is then served from the tier.
    room_.clear();
    const absl::Status made =
        v.is_range
            ? shard.PrepareWriteRange(*v.range, v.begin, v.end,
                                      SparseRows::Write::kRead, -1, &room_)
            : shard.PrepareWrite(*v.range, v.keys, SparseRows::Write::kRead, -1,
                                 &room_);
    ForwardRoom(shard, v.range, room_, forwards);
    (void)made;
  }
  const float* in = v.values;
  if (!v.is_range && shard.layout().dense && OpWrites(v.op) &&
      ApplyDenseRuns(v.op, v.keys, v.values, v.vector, shard.width(), store)) {
    // Done run by run (below): a sorted batch of a dense table.
  } else {
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
        v.is_range ? store.PushRange(v.begin, v.end, in)
                   : store.Push(v.keys, in);
        break;
      default:
        break;
    }
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
      DP_RETURN_IF_ERROR(ReadBatch(pool_, shard.layout().dense, v.keys,
                                   v.vector, shard.width(), store,
                                   reinterpret_cast<float*>(out.data())));
      reply->values = Payload::Own(std::move(out));
    }
  }
  return absl::OkStatus();
}

absl::Status Dispatcher::ApplySynced(const Validated& v,
                                     const IncomingMessage& request,
                                     OutgoingReply* reply,
                                     std::vector<DeferredReply>* released,
                                     std::vector<ForwardedWrite>* forwards) {
  const proto::DataHeader& h = request.header;
  TableShard& shard = *v.shard;
  const bool pull = v.op == proto::PUSH_PULL;
  const size_t first_waiter = waiters_.size();
  // Every synced push waits for its step: acknowledging a held gradient
  // would let it be lost with this server before the step applies it.
  room_.clear();
  const TableShard::SyncOutcome outcome =
      v.is_range ? shard.PushSynced(*v.range, v.begin, v.end, h.worker_rank(),
                                    h.worker_clock(), v.values,
                                    request.reply_token, &waiters_, &room_)
                 : shard.PushSyncedKeys(*v.range, v.stretch, v.keys,
                                        h.worker_rank(), h.worker_clock(),
                                        v.values, request.reply_token,
                                        &waiters_, &applied_keys_, &room_);
  reply->header.set_discarded(outcome.result ==
                              TableShard::SyncResult::kDiscarded);
  if (outcome.result == TableShard::SyncResult::kHeld) {
    reply->deferred = true;
    if (pull) pull_waiters_.insert(request.reply_token);
    return absl::OkStatus();
  }
  const bool replicated =
      outcome.result == TableShard::SyncResult::kApplied && Replicated(v);
  if (replicated) {
    // A bounded table's room first, then the step. A step refused at the
    // cap closes on the backups with nothing applied (no keys; a range
    // step of a sparse table is not forwarded).
    ForwardRoom(shard, v.range, room_, forwards);
    if (outcome.status.ok() || !v.is_range) {
      // One rank on a range: the backups get the request's own gradient.
      const bool own =
          outcome.status.ok() && v.is_range && outcome.applied == v.values;
      // The step's part: a key range, or a key batch's stretch.
      const KeyRange part = v.is_range ? KeyRange{v.begin, v.end} : v.stretch;
      forwards->push_back(StepForward(shard, v.range, part.begin, part.end,
                                      h.worker_clock(), outcome.applied,
                                      own ? &request : nullptr));
    }
  }
  // The step is applied (or was, for a late push): the values are what a
  // pull at the next clock reads, for this request if it asks and for every
  // PushPull that waited for the step (whatever op completed it).
  const Clock next = h.worker_clock() + 1;
  if (pull) {
    reply->header.set_staleness(shard.ObservePull(next));
    reply->values =
        ReadRange(*v.range->store, v.begin, v.end, v.floats, 0, !replicated);
  }
  ReleaseStepWaiters(shard, *v.range, v.begin, v.end, v.n, next, replicated,
                     first_waiter, outcome.status, released);
  return outcome.status;
}

ForwardedWrite Dispatcher::StepForward(TableShard& shard,
                                       TableShard::Range* range, Key begin,
                                       Key end, Clock clock,
                                       const float* applied,
                                       const IncomingMessage* own) {
  // The step as the backups apply it: one push of what the handler
  // applied (the ranks' mean), marking the clock applied.
  const bool is_range = shard.layout().dense;
  ForwardedWrite f;
  f.range = range;
  f.step_clock = clock;
  proto::DataHeader& fh = f.header;
  fh.set_op(proto::PUSH);
  fh.set_table_id(shard.spec().id());
  fh.set_epoch(epoch());
  fh.set_width(shard.width());
  fh.set_worker_clock(-1);  // a step counts every rank (step_clock below)
  if (own != nullptr) {
    std::shared_ptr<const RetainedRequest> frames = env_->Retain(*own);
    f.values = frames->values;
    f.owner = std::move(frames);
  } else {
    const size_t floats =
        (is_range ? end - begin : applied_keys_.size()) * shard.width();
    auto copy = std::make_shared<std::pair<Buffer, Buffer>>(
        pool_->Acquire(floats * sizeof(float)),
        pool_->Acquire(is_range ? 0 : applied_keys_.size() * sizeof(Key)));
    // A step of empty batches applies nothing and `applied` may be null:
    // memcpy's pointers must not be null even for no bytes.
    if (floats > 0) {
      std::memcpy(copy->first.data(), applied, floats * sizeof(float));
    }
    f.values = absl::MakeConstSpan(
        reinterpret_cast<const float*>(copy->first.data()), floats);
    if (!is_range) {
      if (!applied_keys_.empty()) {
        std::memcpy(copy->second.data(), applied_keys_.data(),
                    applied_keys_.size() * sizeof(Key));
      }
      f.keys =
          absl::MakeConstSpan(reinterpret_cast<const Key*>(copy->second.data()),
                              applied_keys_.size());
    }
    f.owner = std::move(copy);
  }
  // A key batch's stretch travels as the range too: the backups mark its
  // clock applied there.
  fh.set_is_range(is_range);
  fh.set_range_begin(begin);
  fh.set_range_end(end);
  fh.set_num_keys(is_range ? end - begin : f.keys.size());
  return f;
}

void Dispatcher::ReleaseStepWaiters(TableShard& shard, TableShard::Range& range,
                                    Key begin, Key end, uint64_t n, Clock next,
                                    bool replicated, size_t first_waiter,
                                    const absl::Status& status,
                                    std::vector<DeferredReply>* released) {
  for (size_t i = first_waiter; i < waiters_.size(); ++i) {
    DeferredReply d;
    d.reply_token = waiters_[i];
    if (!status.ok()) {
      // The step did not fit in a bounded table: every push of it hears so.
      pull_waiters_.erase(d.reply_token);
      SetReplyStatus(Annotate(status, absl::StrCat("server ", self_)),
                     &d.reply.header);
      released->push_back(std::move(d));
      continue;
    }
    d.reply.header.set_num_keys(n);
    d.reply.header.set_width(shard.width());
    // A PushPull waiter gets the values, whatever op completed the step
    // (PushPulls are dense: [begin, end) is the step's part).
    if (pull_waiters_.erase(d.reply_token) > 0) {
      d.reply.header.set_staleness(shard.ObservePull(next));
      d.reply.values = ReadRange(*range.store, begin, end,
                                 (end - begin) * shard.width(), 0, !replicated);
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
    if (writes) {
      DP_VLOG(2) << "table " << request.header.table_id() << " keys ["
                 << r.begin << ", " << r.end << "): vector command (client "
                 << request.header.client_id() << " seq "
                 << request.header.seq() << ") " << cmd.ShortDebugString();
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
      // The keys were validated against this range: a failure here is a
      // store's own error, answered as such rather than with stale values.
      const absl::Status read =
          store.Get(v.keys, reinterpret_cast<float*>(out.data()));
      if (!read.ok()) {
        SetReplyStatus(Annotate(read, absl::StrCat("server ", self_)),
                       &reply->header);
        return;
      }
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
    SetReplyStatus(s, &reply->header);
  };
  Epoch epoch;
  std::shared_ptr<TableShard> shard = Lookup(h.table_id(), &epoch);
  const KeyRange kr{r.range_begin(), r.range_end()};
  TableShard::Range* range = shard != nullptr ? shard->FindExact(kr) : nullptr;
  if (range == nullptr || range->role != Role::kBackup ||
      range->primary != h.sender()) {
    if (h.epoch() > epoch) {
      return fail(
          WithReason(absl::UnavailableError(absl::StrCat(
                         "server ", self_, " has applied epoch ", epoch,
                         " but the primary is at ", h.epoch(), "; resend")),
                     ErrorReason::kServerBehind));
    }
    return fail(
        WithReason(absl::AbortedError(absl::StrCat(
                       "server ", self_, " is not a backup of node ",
                       h.sender(), " for table ", h.table_id(), " keys [",
                       kr.begin, ", ", kr.end, ") in epoch ", epoch)),
                   ErrorReason::kNotOwner));
  }
  if (replicator_ == nullptr) {
    return fail(absl::FailedPreconditionError("replication is off here"));
  }
  absl::StatusOr<bool> apply = replicator_->Accept(h.table_id(), kr.begin, r);
  if (!apply.ok()) return fail(apply.status());
  if (*apply) {
    absl::Status s = ApplyReplicated(*shard, *range, request);
    if (!s.ok()) {
      DP_LOG(ERROR) << "cannot apply replication message " << r.stream_seq()
                    << " from node " << h.sender() << ": " << s;
      return fail(s);
    }
    replicator_->Applied(h.table_id(), kr.begin, r);
    replica_writes_.fetch_add(1, std::memory_order_relaxed);
  }
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
  if (absl::Status s = store.GetRange(
          begin, end, reinterpret_cast<float*>(out.data()), vector);
      !s.ok()) {
    // A sparse range whose cold tier failed: those rows read as their
    // initial values (the failure is the disk's, logged here).
    DP_LOG(WARNING) << "range read [" << begin << ", " << end << "): " << s;
  }
  return Payload::Own(std::move(out));
}

void Dispatcher::ExpireIdle() {
  for (const auto& [id, shard] : Tables()) {
    std::vector<std::pair<TableShard::Range*, std::vector<Key>>> gone;
    shard->ExpireIdle(/*max_rows=*/4096, &gone);
    for (auto& [range, keys] : gone) {
      SparseRows::Room room;
      room.gone = std::move(keys);
      std::vector<ForwardedWrite> forwards;
      ForwardRoom(*shard, range, room, &forwards);
      // Nobody waits for these: they only keep the backups' rows the same.
      if (!forwards.empty()) replicator_->Hold(std::move(forwards), {}, 0, 0);
    }
  }
}

void Dispatcher::FillStats(proto::ServerStats* stats) const {
  stats->set_node_id(self_);
  for (int op = proto::PUT; op <= proto::VECTOR; ++op) {
    (*stats->mutable_requests_by_op())[proto::Op_Name(
        static_cast<proto::Op>(op))] = requests_by_op_[op].load();
  }
  stats->set_errors(errors_.load());
  stats->set_retries_answered(retries_answered_.load());
  stats->set_replica_messages_applied(replica_writes_.load());
  absl::MutexLock lock(&mu_);
  stats->set_epoch(epoch_);
  for (const auto& [id, shard] : tables_) {
    proto::TableStats* t = stats->add_tables();
    shard->FillStats(t);
    t->set_id(id);
  }
}

void Dispatcher::FillReplicationStats(proto::ServerStats* stats) const {
  if (replicator_ == nullptr) return;
  stats->set_replication_forwarded(replicator_->forwarded());
  stats->set_replication_resent(replicator_->resent());
  stats->set_replication_copies(replicator_->copies_done());
  stats->set_replication_rows_copied(replicator_->rows_copied());
  stats->set_held_writes(replicator_->held_writes());
}

void Dispatcher::FillRangeLoads(
    google::protobuf::RepeatedPtrField<proto::RangeLoad>* out) const {
  std::vector<std::shared_ptr<TableShard>> shards;
  {
    absl::MutexLock lock(&mu_);
    for (const auto& [id, shard] : tables_) shards.push_back(shard);
  }
  for (const auto& shard : shards) {
    for (const auto& [begin, range] : shard->ranges()) {
      if (range->role != Role::kPrimary) continue;
      proto::RangeLoad* l = out->Add();
      l->set_table_id(shard->spec().id());
      l->set_begin(range->range().begin);
      l->set_end(range->range().end);
      l->set_bytes(range->store->value_bytes() + range->store->state_bytes());
      l->set_rows(range->store->rows());
      l->set_requests(range->served_requests);
      l->set_keys(range->served_keys);
      l->set_split_key(range->MedianKey());
    }
  }
}

}  // namespace server_internal
}  // namespace downpour
