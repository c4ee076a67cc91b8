#include "server/internal/checkpointer.h"

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <system_error>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "common/status_macros.h"
#include "server/internal/range_ledgers.h"

namespace downpour {
namespace server_internal {

using Role = TableShard::Range::Role;

// A range copied at its cut, waiting to be written.
struct Checkpointer::Captured {
  TableId table = kNoTable;
  proto::TableSpec spec;
  KeyRange range{0, 0};
  proto::RangeLedgers ledgers;
  std::vector<std::unique_ptr<RowChunk>> chunks;
  uint64_t rows = 0;
  uint64_t bytes = 0;
  bool cold = false;          // the range keeps a cold tier
  std::string cold_snapshot;  // its copy at the cut
};

// A range that has not reached the cut's clock yet.
struct Checkpointer::Waiting {
  TableId table;
  std::shared_ptr<TableShard> shard;
  KeyRange range;
};

// One checkpoint being cut: shared by the data thread (cutting) and the
// thread writing (the gRPC call); fields under Checkpointer::mu_.
struct Checkpointer::Cut {
  uint64_t id = 0;
  Clock clock = -1;
  // Changed by the data thread only, under the lock.
  std::vector<Waiting> waiting;
  std::deque<std::unique_ptr<Captured>> ready;
  bool all_cut = false;
  bool cancelled = false;
  absl::Status error;
};

// A closure run on the data thread, and its completion.
struct Checkpointer::Call {
  bool done = false;
};

namespace {

// Whether a range can be cut at `clock`: 0 yes, -1 not yet, +1 never (a
// part is past it; *past gets that part's clock).
int CutState(const TableShard& shard, const TableShard::Range& range,
             Clock clock, Clock* past) {
  if (clock < 0 || shard.spec().sync_workers() == 0) return 0;
  int state = 0;
  for (const auto& [part, steps] : range.steps) {
    const Clock next = steps.next_clock();
    if (next > clock) {
      *past = next;
      return 1;
    }
    if (next < clock) state = -1;
  }
  return state;
}

std::string Describe(const TableShard& shard, KeyRange r) {
  return absl::StrCat("table '", shard.spec().name(), "' keys [", r.begin, ", ",
                      r.end, ")");
}

// Rows stored one after another (values, then state, per row) as a
// chunk's blocks (all values, then all state); `c->keys` names them.
void ToBlocks(const std::vector<float>& rows, size_t width, size_t row_floats,
              RowChunk* c) {
  const size_t n = c->keys.size();
  const size_t sw = row_floats - width;
  c->has_state = sw > 0;
  c->data.resize(n * row_floats);
  for (size_t i = 0; i < n; ++i) {
    std::copy_n(rows.data() + i * row_floats, width,
                c->data.data() + i * width);
    std::copy_n(rows.data() + i * row_floats + width, sw,
                c->data.data() + n * width + i * sw);
  }
}

}  // namespace

Checkpointer::Checkpointer(std::string server_name, storage::Database* db,
                           const Dispatcher* dispatcher, DataThread data,
                           size_t chunk_bytes, storage::ColdStore* cold)
    : name_(std::move(server_name)),
      db_(db),
      cold_(cold),
      dispatcher_(dispatcher),
      data_(std::move(data)),
      chunk_bytes_(chunk_bytes) {
  if (db_ != nullptr) {
    store_ = std::make_unique<storage::CheckpointStore>(db_);
  }
}

Checkpointer::~Checkpointer() { Stop(); }

void Checkpointer::Stop() {
  absl::MutexLock lock(&mu_);
  stopped_ = true;
}

absl::Status Checkpointer::OnDataThread(std::function<void()> fn) {
  auto call = std::make_shared<Call>();
  data_.post([this, call, fn = std::move(fn)] {
    fn();
    absl::MutexLock lock(&mu_);
    call->done = true;
  });
  absl::MutexLock lock(&mu_);
  auto done = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return call->done || stopped_;
  };
  mu_.Await(absl::Condition(&done));
  if (!call->done) return absl::UnavailableError("server stopping");
  return absl::OkStatus();
}

std::unique_ptr<RowChunk> Checkpointer::TakeChunk() {
  absl::MutexLock lock(&mu_);
  if (free_chunks_.empty()) return std::make_unique<RowChunk>();
  std::unique_ptr<RowChunk> c = std::move(free_chunks_.back());
  free_chunks_.pop_back();
  return c;
}

void Checkpointer::ReturnChunks(std::vector<std::unique_ptr<RowChunk>> chunks) {
  absl::MutexLock lock(&mu_);
  for (auto& c : chunks) free_chunks_.push_back(std::move(c));
}

absl::StatusOr<proto::CheckpointPartReply> Checkpointer::CheckpointPart(
    const proto::CheckpointPartRequest& req) {
  {
    absl::MutexLock lock(&mu_);
    last_request_ = absl::Now();
    last_request_id_ = std::max(last_request_id_, req.checkpoint_id());
  }
  if (store_ == nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat("server '", name_,
                     "' has no --data_dir: it cannot take part in "
                     "checkpoints"));
  }
  if (req.mode() == proto::CheckpointPartRequest::PROBE) return Probe();
  return Write(req);
}

absl::StatusOr<proto::CheckpointPartReply> Checkpointer::Probe() {
  auto reply = std::make_shared<proto::CheckpointPartReply>();
  reply->set_min_clock(-1);
  reply->set_max_clock(-1);
  DP_RETURN_IF_ERROR(OnDataThread([this, reply] {
    for (const auto& [id, shard] : dispatcher_->Tables()) {
      if (shard->spec().sync_workers() == 0) continue;
      for (const auto& [begin, range] : shard->ranges()) {
        if (range->role != Role::kPrimary) continue;
        for (const auto& [part, steps] : range->steps) {
          const Clock c = steps.next_clock();
          if (reply->min_clock() < 0 || c < reply->min_clock()) {
            reply->set_min_clock(c);
          }
          reply->set_max_clock(std::max(reply->max_clock(), c));
        }
      }
    }
  }));
  return *reply;
}

std::unique_ptr<Checkpointer::Captured> Checkpointer::Capture(
    TableId id, const TableShard& shard, TableShard::Range& range) {
  auto c = std::make_unique<Captured>();
  c->table = id;
  c->spec = shard.spec();
  c->range = range.range();
  ExportLedgers(range, &c->ledgers);
  const SparseRows* sparse = range.store->sparse();
  c->cold = sparse != nullptr && sparse->bounds().cold;
  std::optional<uint64_t> cursor = 0;
  while (cursor.has_value()) {
    std::unique_ptr<RowChunk> chunk = TakeChunk();
    // The cold tier is taken as linked files (SnapshotCold), not row by row.
    cursor = range.store->ExportRows(*cursor, chunk_bytes_, chunk.get(),
                                     /*with_cold=*/false);
    c->rows += chunk->count;
    c->bytes +=
        chunk->data.size() * sizeof(float) + chunk->keys.size() * sizeof(Key);
    c->chunks.push_back(std::move(chunk));
  }
  return c;
}

void Checkpointer::StartCut(const std::shared_ptr<Cut>& cut) {
  std::vector<std::unique_ptr<Captured>> captured;
  std::vector<Waiting> waiting;
  absl::Status error;
  for (const auto& [id, shard] : dispatcher_->Tables()) {
    for (const auto& [begin, range] : shard->ranges()) {
      if (range->role != Role::kPrimary) continue;
      if (range->lost) {
        error = absl::DataLossError(
            absl::StrCat(Describe(*shard, range->range()),
                         " is lost on this server; it cannot be checkpointed"));
        break;
      }
      Clock past = 0;
      const int state = CutState(*shard, *range, cut->clock, &past);
      if (state > 0) {
        error = absl::AbortedError(
            absl::StrCat(Describe(*shard, range->range()), " is at clock ",
                         past, ", past the cut's clock ", cut->clock));
        break;
      }
      if (state < 0) {
        waiting.push_back({id, shard, range->range()});
      } else {
        captured.push_back(Capture(id, *shard, *range));
      }
    }
    if (!error.ok()) break;
  }
  if (error.ok()) error = SnapshotCold(cut->id, captured);
  absl::MutexLock lock(&mu_);
  for (auto& c : captured) cut->ready.push_back(std::move(c));
  if (!error.ok()) {
    cut->error = error;
    return;
  }
  cut->waiting = std::move(waiting);
  cut->all_cut = cut->waiting.empty();
  if (!cut->all_cut) pending_ = cut;
}

std::string Checkpointer::ColdSnapshotDir(const std::string& name) const {
  return absl::StrCat(cold_->dir(), "-checkpoints/", name);
}

absl::Status Checkpointer::SnapshotCold(
    uint64_t checkpoint, std::vector<std::unique_ptr<Captured>>& captured) {
  std::vector<std::pair<uint32_t, uint64_t>> ranges;
  for (const auto& c : captured) {
    if (c->cold) ranges.emplace_back(c->table, c->range.begin);
  }
  if (ranges.empty()) return absl::OkStatus();
  if (cold_ == nullptr) {
    return absl::FailedPreconditionError("a cold tier without a store");
  }
  // One folder for the ranges cut in this call, on the data thread at the
  // cut, where the rows in memory are copied too: their chunk files are
  // synced and linked, nothing copied (the ranges copy a linked chunk
  // before they next write it).
  const std::string name = absl::StrCat(checkpoint, "/", ++cold_snapshots_);
  std::error_code ec;
  std::filesystem::create_directories(ColdSnapshotDir(absl::StrCat(checkpoint)),
                                      ec);
  std::filesystem::remove_all(ColdSnapshotDir(name), ec);
  DP_RETURN_IF_ERROR(cold_->Snapshot(ColdSnapshotDir(name), ranges),
                     "checkpoint ", checkpoint, ": cold tier");
  for (auto& c : captured) {
    if (c->cold) c->cold_snapshot = name;
  }
  return absl::OkStatus();
}

absl::Status Checkpointer::RestoreCold(const std::string& snapshot,
                                       TableId table, KeyRange kr, size_t width,
                                       proto::RestoreReply* reply) {
  if (cold_ == nullptr) {
    return absl::FailedPreconditionError(
        "the checkpoint holds a cold tier but this server keeps none");
  }
  // Read from the copy here, imported on the data thread a batch at a time.
  auto chunk = std::make_shared<RowChunk>();
  chunk->kind = proto::RowChunkInfo::COLD;
  auto import_status = std::make_shared<absl::Status>();
  auto flush = [&]() -> absl::Status {
    if (chunk->count == 0) return absl::OkStatus();
    DP_RETURN_IF_ERROR(OnDataThread([this, chunk, import_status, kr, table] {
      std::shared_ptr<TableShard> shard;
      for (auto& [id, s] : dispatcher_->Tables()) {
        if (id == table) shard = s;
      }
      TableShard::Range* range =
          shard == nullptr ? nullptr : shard->FindExact(kr);
      if (range == nullptr) {
        *import_status =
            absl::AbortedError("the range left this server during the restore");
        return;
      }
      *import_status = range->store->ImportRows(*chunk);
    }));
    reply->set_rows(reply->rows() + chunk->count);
    reply->set_bytes(reply->bytes() + chunk->data.size() * sizeof(float));
    chunk->count = 0;
    chunk->keys.clear();
    chunk->data.clear();
    return *import_status;
  };
  std::vector<float> rows;  // row-major: values and state of each row
  size_t row_floats = 0;
  DP_RETURN_IF_ERROR(storage::ColdStore::ReadSnapshot(
      ColdSnapshotDir(snapshot), table, kr.begin,
      [&](uint64_t key, absl::Span<const float> row) -> absl::Status {
        row_floats = row.size();
        chunk->keys.push_back(key);
        rows.insert(rows.end(), row.begin(), row.end());
        ++chunk->count;
        if (chunk->count < 4096) return absl::OkStatus();
        ToBlocks(rows, width, row_floats, chunk.get());
        rows.clear();
        return flush();
      }));
  if (chunk->count > 0) {
    ToBlocks(rows, width, row_floats, chunk.get());
    DP_RETURN_IF_ERROR(flush());
  }
  return absl::OkStatus();
}

void Checkpointer::AfterRequest() {
  if (pending_ == nullptr) return;
  CheckWaiting();
}

void Checkpointer::CheckWaiting() {
  std::shared_ptr<Cut> cut = pending_;
  std::vector<std::unique_ptr<Captured>> captured;
  absl::Status error;
  std::vector<Waiting> still;
  {
    absl::MutexLock lock(&mu_);
    if (cut->cancelled) {
      pending_.reset();
      return;
    }
  }
  for (Waiting& w : cut->waiting) {
    TableShard::Range* range = w.shard->FindExact(w.range);
    if (range == nullptr || range->role != Role::kPrimary) {
      error = absl::AbortedError(
          absl::StrCat(Describe(*w.shard, w.range),
                       " left this server during the checkpoint (a new map)"));
      break;
    }
    Clock past = 0;
    const int state = CutState(*w.shard, *range, cut->clock, &past);
    if (state > 0) {
      error = absl::AbortedError(absl::StrCat(Describe(*w.shard, w.range),
                                              " went past clock ", cut->clock,
                                              " to ", past));
      break;
    }
    if (state < 0) {
      still.push_back(w);
    } else {
      captured.push_back(Capture(w.table, *w.shard, *range));
    }
  }
  if (error.ok()) error = SnapshotCold(cut->id, captured);
  // The writing thread reads `waiting` (under the lock) for its messages.
  absl::MutexLock lock(&mu_);
  for (auto& c : captured) cut->ready.push_back(std::move(c));
  if (!error.ok()) {
    cut->error = error;
    cut->waiting.clear();
  } else {
    cut->waiting = std::move(still);
  }
  if (cut->waiting.empty()) {
    cut->all_cut = error.ok();
    pending_.reset();
  }
}

absl::StatusOr<proto::CheckpointPartReply> Checkpointer::Write(
    const proto::CheckpointPartRequest& req) {
  const absl::Time start = absl::Now();
  const absl::Time deadline =
      start + (req.timeout_ms() > 0 ? absl::Milliseconds(req.timeout_ms())
                                    : absl::Seconds(60));
  {
    absl::MutexLock lock(&mu_);
    if (writing_ || restoring_) {
      return absl::FailedPreconditionError(absl::StrCat(
          "server '", name_, "' is still writing a checkpoint or restoring"));
    }
    writing_ = true;
  }
  auto cut = std::make_shared<Cut>();
  cut->id = req.checkpoint_id();
  cut->clock = req.clock();
  // A disk that was full may have room again.
  absl::Status status = db_->Resume();
  if (status.ok()) {
    data_.post([this, cut] { StartCut(cut); });
  }
  proto::CheckpointPart part;
  part.set_id(cut->id);
  part.set_clock(cut->clock);
  part.set_server(name_);
  proto::CheckpointPartReply reply;
  absl::Duration copy_time, write_time;
  while (status.ok()) {
    std::unique_ptr<Captured> next;
    {
      absl::MutexLock lock(&mu_);
      auto progress = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return stopped_ || !cut->ready.empty() || !cut->error.ok() ||
               cut->all_cut;
      };
      if (!mu_.AwaitWithDeadline(absl::Condition(&progress), deadline)) {
        cut->cancelled = true;
        std::string what;
        for (const Waiting& w : cut->waiting) {
          absl::StrAppend(&what, what.empty() ? "" : ", ",
                          Describe(*w.shard, w.range));
        }
        status = absl::DeadlineExceededError(absl::StrCat(
            "checkpoint ", cut->id, " on server '", name_, "': ", what,
            " did not reach clock ", cut->clock,
            " in time (a step that never completes: a worker missing?)"));
        break;
      }
      if (stopped_) {
        status = absl::UnavailableError("server stopping");
        break;
      }
      if (!cut->error.ok()) {
        status = cut->error;
        break;
      }
      if (!cut->ready.empty()) {
        next = std::move(cut->ready.front());
        cut->ready.pop_front();
      } else if (cut->all_cut) {
        break;
      }
    }
    if (next == nullptr) continue;
    // Written here, off the data thread, which goes on serving.
    const absl::Time w0 = absl::Now();
    for (size_t i = 0; i < next->chunks.size() && status.ok(); ++i) {
      const RowChunk& c = *next->chunks[i];
      proto::RowChunkInfo info;
      info.set_first_key(c.first_key);
      info.set_count(c.count);
      info.set_has_state(c.has_state);
      info.set_kind(c.kind);
      for (uint32_t v : c.vectors) info.add_vectors(v);
      status = store_->WriteChunk(cut->id, next->table, next->range.begin, i,
                                  info, c.keys, c.data);
    }
    write_time += absl::Now() - w0;
    proto::CheckpointPart::Range* r = part.add_ranges();
    *r->mutable_spec() = next->spec;
    r->set_begin(next->range.begin);
    r->set_end(next->range.end);
    *r->mutable_ledgers() = next->ledgers;
    r->set_chunks(next->chunks.size());
    r->set_rows(next->rows);
    r->set_bytes(next->bytes);
    r->set_cold_snapshot(next->cold_snapshot);
    proto::CheckpointRange* out = reply.add_ranges();
    out->set_table_id(next->table);
    out->set_begin(next->range.begin);
    out->set_end(next->range.end);
    out->set_server(name_);
    out->set_rows(next->rows);
    out->set_bytes(next->bytes);
    ReturnChunks(std::move(next->chunks));
  }
  copy_time = absl::Now() - start - write_time;
  if (status.ok()) {
    const absl::Time f0 = absl::Now();
    status = store_->FinishPart(part);
    write_time += absl::Now() - f0;
  }
  {
    absl::MutexLock lock(&mu_);
    cut->cancelled = true;
    // Copies not written (a failure) go back to the pool.
    for (auto& c : cut->ready) {
      for (auto& chunk : c->chunks) free_chunks_.push_back(std::move(chunk));
    }
    cut->ready.clear();
    writing_ = false;
  }
  // The data thread forgets a cut still waiting.
  data_.post([this, cut] {
    if (pending_ == cut) pending_.reset();
  });
  if (!status.ok()) {
    DP_LOG(WARNING) << "checkpoint " << req.checkpoint_id() << ": " << status;
    return status;
  }
  reply.set_copy_ms(absl::ToInt64Milliseconds(copy_time));
  reply.set_write_ms(absl::ToInt64Milliseconds(write_time));
  uint64_t bytes = 0;
  for (const auto& r : reply.ranges()) bytes += r.bytes();
  DP_LOG(INFO) << "checkpoint " << req.checkpoint_id() << " at clock "
               << req.clock() << ": " << reply.ranges_size() << " ranges, "
               << bytes << " bytes written in "
               << absl::FormatDuration(absl::Now() - start) << " (writing "
               << absl::FormatDuration(write_time) << ")";
  return reply;
}

absl::Status Checkpointer::DropCheckpoints(
    const proto::DropCheckpointsRequest& req) {
  {
    absl::MutexLock lock(&mu_);
    completed_ = std::max(completed_, req.completed());
  }
  if (store_ == nullptr) return absl::OkStatus();
  for (uint64_t id : req.drop()) {
    DP_RETURN_IF_ERROR(store_->Drop(id), "drop checkpoint ", id);
    if (cold_ != nullptr) {
      std::error_code ec;
      std::filesystem::remove_all(ColdSnapshotDir(absl::StrCat(id)), ec);
    }
  }
  if (cold_ != nullptr) {
    // And the copies of checkpoints before the oldest kept.
    std::error_code ec;
    for (const auto& e :
         std::filesystem::directory_iterator(ColdSnapshotDir(""), ec)) {
      uint64_t id = 0;
      if (absl::SimpleAtoi(e.path().filename().string(), &id) &&
          id < req.keep_from()) {
        std::filesystem::remove_all(e.path(), ec);
      }
    }
  }
  DP_RETURN_IF_ERROR(store_->DropBefore(req.keep_from()),
                     "drop checkpoints before ", req.keep_from());
  return absl::OkStatus();
}

bool Checkpointer::AwaitCheckpointAfter(absl::Time since,
                                        absl::Duration start_wait,
                                        absl::Duration grace) {
  absl::MutexLock lock(&mu_);
  auto started = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return stopped_ || last_request_ >= since;
  };
  if (!mu_.AwaitWithDeadline(absl::Condition(&started), since + start_wait) ||
      stopped_) {
    return false;
  }
  auto completed = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return stopped_ || completed_ >= last_request_id_;
  };
  return mu_.AwaitWithDeadline(absl::Condition(&completed), since + grace) &&
         !stopped_;
}

absl::StatusOr<proto::RestoreReply> Checkpointer::Restore(
    const proto::RestoreRequest& req) {
  const absl::Time start = absl::Now();
  if (store_ == nullptr) {
    return absl::FailedPreconditionError(absl::StrCat(
        "server '", name_, "' has no --data_dir: nothing to restore from"));
  }
  DP_ASSIGN_OR_RETURN(proto::CheckpointPart part,
                      store_->ReadPart(req.checkpoint_id()), "server '", name_,
                      "'");
  {
    absl::MutexLock lock(&mu_);
    if (writing_ || restoring_) {
      return absl::FailedPreconditionError(absl::StrCat(
          "server '", name_, "' is still writing a checkpoint or restoring"));
    }
    restoring_ = true;
  }
  struct Done {
    ~Done() {
      absl::MutexLock lock(&self->mu_);
      self->restoring_ = false;
    }
    Checkpointer* self;
  } done{this};
  proto::RestoreReply reply;
  for (const proto::CheckpointRange& want : req.ranges()) {
    const proto::CheckpointPart::Range* stored = nullptr;
    for (const auto& r : part.ranges()) {
      if (r.spec().id() == want.table_id() && r.begin() == want.begin() &&
          r.end() == want.end()) {
        stored = &r;
      }
    }
    const std::string what = absl::StrCat(
        "checkpoint ", req.checkpoint_id(), " table ", want.table_id(),
        " keys [", want.begin(), ", ", want.end(), ") on server '", name_, "'");
    if (stored == nullptr) {
      return absl::NotFoundError(absl::StrCat(
          what, ": not in this server's part (", db_->path(), ")"));
    }
    // The range must be held here as a primary already (the scheduler's
    // restore map); it is reset to the checkpoint's ledgers and, for a
    // sparse table, emptied (rows created since must go).
    auto prepared = std::make_shared<absl::Status>();
    const KeyRange kr{want.begin(), want.end()};
    auto ledgers = std::make_shared<proto::RangeLedgers>(stored->ledgers());
    auto spec = std::make_shared<proto::TableSpec>(stored->spec());
    const Clock clock = part.clock();
    DP_RETURN_IF_ERROR(
        OnDataThread([this, prepared, kr, ledgers, spec, what, clock] {
          std::shared_ptr<TableShard> shard;
          for (auto& [id, s] : dispatcher_->Tables()) {
            if (id == spec->id()) shard = s;
          }
          TableShard::Range* range =
              shard == nullptr ? nullptr : shard->FindExact(kr);
          if (range == nullptr || range->role != Role::kPrimary) {
            *prepared = absl::FailedPreconditionError(
                absl::StrCat(what, ": not held here as a primary (yet)"));
            return;
          }
          const proto::TableSpec& now = shard->spec();
          if (now.width() != spec->width() || now.kind() != spec->kind() ||
              now.vectors_size() != spec->vectors_size() ||
              now.handler().name() != spec->handler().name()) {
            *prepared = absl::DataLossError(absl::StrCat(
                what, ": the table's spec differs from the checkpoint's"));
            return;
          }
          // Held BSP steps belong to the state being replaced.
          for (auto& [p, steps] : range->steps) {
            for (uint64_t token : steps.Abandon()) {
              DeferredReply d;
              d.reply_token = token;
              SetReplyStatus(absl::DataLossError(absl::StrCat(
                                 what, ": rolled back to a checkpoint")),
                             &d.reply.header);
              data_.send_deferred(std::move(d));
            }
          }
          if (!shard->layout().dense) {
            range->store = std::make_unique<RangeStore>(&shard->layout(), kr);
          }
          ImportLedgers(*ledgers, absl::Now(), range);
          // Staleness is measured against the steps applied: those of a BSP
          // checkpoint at clock c are 0 .. c - 1 for every rank.
          if (clock > 0) {
            for (int r = 0; r < shard->tracked_ranks(); ++r) {
              shard->RecordApplied(r, clock - 1);
            }
          }
        }));
    DP_RETURN_IF_ERROR(*prepared);
    // The rows, a chunk at a time: read here, imported on the data thread
    // (a copy in a pooled chunk, owned by the closure).
    auto import_status = std::make_shared<absl::Status>();
    const uint32_t table = want.table_id();
    DP_RETURN_IF_ERROR(
        store_->ReadChunks(
            req.checkpoint_id(), table, want.begin(), stored->chunks(),
            [&](const storage::StoredChunk& stored_chunk) -> absl::Status {
              std::shared_ptr<RowChunk> chunk(
                  TakeChunk().release(), [this](RowChunk* c) {
                    std::vector<std::unique_ptr<RowChunk>> v;
                    v.emplace_back(c);
                    ReturnChunks(std::move(v));
                  });
              chunk->first_key = stored_chunk.info.first_key();
              chunk->count = stored_chunk.info.count();
              chunk->has_state = stored_chunk.info.has_state();
              chunk->kind = stored_chunk.info.kind();
              chunk->vectors.assign(stored_chunk.info.vectors().begin(),
                                    stored_chunk.info.vectors().end());
              chunk->keys.assign(stored_chunk.keys.begin(),
                                 stored_chunk.keys.end());
              chunk->data.assign(stored_chunk.data.begin(),
                                 stored_chunk.data.end());
              reply.set_rows(reply.rows() + chunk->count);
              reply.set_bytes(reply.bytes() +
                              chunk->data.size() * sizeof(float) +
                              chunk->keys.size() * sizeof(Key));
              DP_RETURN_IF_ERROR(
                  OnDataThread([this, chunk, import_status, kr, table] {
                    std::shared_ptr<TableShard> shard;
                    for (auto& [id, s] : dispatcher_->Tables()) {
                      if (id == table) shard = s;
                    }
                    TableShard::Range* range =
                        shard == nullptr ? nullptr : shard->FindExact(kr);
                    if (range == nullptr) {
                      *import_status = absl::AbortedError(
                          "the range left this server during the restore");
                      return;
                    }
                    *import_status = range->store->ImportRows(*chunk);
                  }));
              return *import_status;
            }),
        what);
    if (!stored->cold_snapshot().empty()) {
      DP_RETURN_IF_ERROR(RestoreCold(stored->cold_snapshot(), table, kr,
                                     stored->spec().width(), &reply),
                         what);
    }
    reply.set_ranges(reply.ranges() + 1);
  }
  reply.set_duration_ms(absl::ToInt64Milliseconds(absl::Now() - start));
  DP_LOG(INFO) << "restored " << reply.ranges() << " ranges of checkpoint "
               << req.checkpoint_id() << " (clock " << part.clock() << ", "
               << reply.bytes() << " bytes) in " << reply.duration_ms()
               << " ms";
  return reply;
}

absl::StatusOr<proto::ExportRowsReply> Checkpointer::ExportRows(
    const proto::ExportRowsRequest& req) {
  auto reply = std::make_shared<proto::ExportRowsReply>();
  auto status = std::make_shared<absl::Status>();
  const size_t max_bytes = std::clamp<size_t>(
      req.max_bytes() == 0 ? size_t{4} << 20 : req.max_bytes(), 1024,
      size_t{32} << 20);
  DP_RETURN_IF_ERROR(OnDataThread([this, req, reply, status, max_bytes] {
    std::shared_ptr<TableShard> shard;
    for (auto& [id, s] : dispatcher_->Tables()) {
      if (id == req.table_id()) shard = s;
    }
    if (shard == nullptr) {
      *status = absl::NotFoundError(
          absl::StrCat("table ", req.table_id(), " is not held here"));
      return;
    }
    auto it = shard->ranges().find(req.range_begin());
    if (it == shard->ranges().end() || it->second->role != Role::kPrimary) {
      *status = absl::FailedPreconditionError(
          absl::StrCat("table '", shard->spec().name(), "': no range from key ",
                       req.range_begin(), " served here as primary"));
      return;
    }
    TableShard::Range& range = *it->second;
    if (range.lost) {
      *status = absl::DataLossError(
          absl::StrCat(Describe(*shard, range.range()), " is lost"));
      return;
    }
    RowChunk chunk;
    const std::optional<uint64_t> next =
        range.store->ExportRows(req.cursor(), max_bytes, &chunk);
    if (chunk.kind == proto::RowChunkInfo::PENDING) {
      // Admission counters are not parameters: an empty chunk.
      chunk.count = 0;
      chunk.keys.clear();
    }
    // The parameters are the chunk's first block (rows in memory or in the
    // cold tier alike).
    const size_t floats = chunk.count * shard->width();
    reply->set_first_key(chunk.first_key);
    reply->set_count(chunk.count);
    reply->set_keys(chunk.keys.data(), chunk.keys.size() * sizeof(Key));
    reply->set_values(chunk.data.data(), floats * sizeof(float));
    reply->set_done(!next.has_value());
    reply->set_next_cursor(next.value_or(0));
  }));
  DP_RETURN_IF_ERROR(*status);
  return *reply;
}

}  // namespace server_internal
}  // namespace downpour
