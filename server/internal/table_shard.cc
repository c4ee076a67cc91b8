#include "server/internal/table_shard.h"

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "common/status_macros.h"

namespace downpour {
namespace server_internal {

absl::StatusOr<std::unique_ptr<TableShard>> TableShard::Create(
    const proto::TableSpec& spec, std::vector<KeyRange> owned,
    const PluginRegistry* plugins, const PinOptions& pin_options) {
  if (spec.width() == 0) return absl::InvalidArgumentError("width is 0");
  DP_ASSIGN_OR_RETURN(std::unique_ptr<UpdateHandler> handler,
                      CreateHandler(spec.handler(), plugins),
                      "table '", spec.name(), "'");
  DP_ASSIGN_OR_RETURN(Initializer init, Initializer::Create(spec.init()),
                      "table '", spec.name(), "'");
  return std::unique_ptr<TableShard>(
      new TableShard(spec, std::move(owned), std::move(handler), init,
                     pin_options));
}

TableShard::TableShard(const proto::TableSpec& spec,
                       std::vector<KeyRange> owned,
                       std::unique_ptr<UpdateHandler> handler,
                       Initializer init, const PinOptions& pin_options)
    : spec_(spec),
      width_(spec.width()),
      owned_(std::move(owned)),
      key_space_{0, spec.kind() == proto::DENSE ? spec.num_keys()
                                                : kKeySpaceEnd},
      handler_(std::move(handler)),
      state_width_(handler_->StateWidth(width_)),
      init_(init),
      dense_(spec.kind() == proto::DENSE),
      num_vectors_(static_cast<uint32_t>(
          std::max(1, dense_ ? spec.vectors_size() : 1))),
      pin_options_(pin_options),
      tracked_ranks_(static_cast<int>(
          std::max(spec.num_workers(), spec.sync_workers()))),
      staleness_(tracked_ranks_, static_cast<int>(spec.sync_workers())) {
  if (dense_) {
    uint64_t rows = 0;
    for (const KeyRange& r : owned_) {
      DenseRange d;
      d.range = r;
      // Uninitialized allocation, then one pass by the initializer: each page
      // is written once.
      d.values = std::make_shared<PinnedArray>(d.rows() * width_);
      init_.Fill(r.begin, d.rows(), width_, d.values->data.get());
      rows += r.end - r.begin;
      d.vectors.resize(num_vectors_ - 1);
      dense_ranges_.push_back(std::move(d));
    }
    rows_.store(rows);
  }
  rounds_.resize(num_vectors_);
  UpdateAccounting();
}

int TableShard::FindRange(Key key) const {
  for (size_t i = 0; i < owned_.size(); ++i) {
    if (owned_[i].Contains(key)) return static_cast<int>(i);
  }
  return -1;
}

void TableShard::EnsureDenseState(DenseRange* r) {
  if (state_width_ == 0 || r->state != nullptr) return;
  r->state.reset(new float[r->rows() * state_width_]);
  handler_->InitState(r->state.get(), r->rows(), width_);
  UpdateAccounting();
}

float* TableShard::VectorData(DenseRange* r, uint32_t vector) {
  if (vector == 0) return r->values->data.get();
  std::unique_ptr<float[]>& v = r->vectors[vector - 1];
  if (v == nullptr) {
    v.reset(new float[r->rows() * width_]());
    UpdateAccounting();
  }
  return v.get();
}

float* TableShard::DenseRow(Key key, float** state, uint32_t vector) {
  for (DenseRange& r : dense_ranges_) {
    if (r.range.Contains(key)) {
      const size_t row = key - r.range.begin;
      if (state != nullptr) {
        EnsureDenseState(&r);
        *state = state_width_ ? r.state.get() + row * state_width_ : nullptr;
      }
      return VectorData(&r, vector) + row * width_;
    }
  }
  return nullptr;  // unreachable when the caller validated ownership
}

TableShard::DenseRange* TableShard::DenseRangeOf(Key key) {
  for (DenseRange& r : dense_ranges_) {
    if (r.range.Contains(key)) return &r;
  }
  return nullptr;
}

std::optional<TableShard::PinnedRows> TableShard::PinRange(Key begin,
                                                           Key end) {
  const size_t bytes = (end - begin) * width_ * sizeof(float);
  if (!dense_ || bytes < pin_options_.min_bytes) return std::nullopt;
  if (copy_replies_until_ > absl::InfinitePast() &&
      absl::Now() < copy_replies_until_) {
    return std::nullopt;
  }
  DenseRange* r = DenseRangeOf(begin);
  std::shared_ptr<PinnedArray> array = r->values;
  const std::pair<size_t, size_t> rows{begin - r->range.begin,
                                       end - r->range.begin};
  {
    absl::MutexLock lock(&array->mu);
    array->pins.push_back(rows);
    array->num_pins.fetch_add(1, std::memory_order_relaxed);
  }
  live_pins_->fetch_add(1, std::memory_order_relaxed);
  zero_copy_replies_.fetch_add(1, std::memory_order_relaxed);
  const float* data = array->data.get() + rows.first * width_;
  // The callback holds the array (not the shard): it may run on ZeroMQ's
  // I/O thread after the shard is gone.
  auto release = [array = std::move(array), rows, live = live_pins_] {
    {
      absl::MutexLock lock(&array->mu);
      auto it = std::find(array->pins.begin(), array->pins.end(), rows);
      if (it != array->pins.end()) {
        *it = array->pins.back();
        array->pins.pop_back();
      }
      array->num_pins.fetch_sub(1, std::memory_order_release);
    }
    live->fetch_sub(1, std::memory_order_relaxed);
  };
  return PinnedRows{data, bytes, std::move(release)};
}

int64_t TableShard::pinned_replies() const {
  return live_pins_->load(std::memory_order_relaxed);
}

void TableShard::PrepareWrite(DenseRange* r, Key begin, Key end) {
  PinnedArray* array = r->values.get();
  // The common case: nothing pinned, no lock.
  if (array->num_pins.load(std::memory_order_acquire) == 0) return;
  const size_t first = begin - r->range.begin, last = end - r->range.begin;
  auto unpinned = [array, first, last]() ABSL_NO_THREAD_SAFETY_ANALYSIS {
    // Runs with array->mu held (absl::Condition).
    for (const auto& [b, e] : array->pins) {
      if (b < last && first < e) return false;
    }
    return true;
  };
  bool clear;
  {
    absl::MutexLock lock(&array->mu);
    if (unpinned()) return;
    // A reply is still being written to the socket: wait for it rather than
    // tear it, and copy the next replies for a while.
    pin_waits_.fetch_add(1, std::memory_order_relaxed);
    copy_replies_until_ = absl::Now() + pin_options_.copy_after_wait;
    clear = array->mu.AwaitWithTimeout(absl::Condition(&unpinned),
                                       pin_options_.wait);
  }
  if (clear) return;
  // The peer is not reading its reply. Do not stall every writer behind it:
  // write to a copy; the pinned array lives on until its pins are released.
  const size_t floats = r->rows() * width_;
  auto fresh = std::make_shared<PinnedArray>(floats);
  std::memcpy(fresh->data.get(), array->data.get(), floats * sizeof(float));
  r->values = std::move(fresh);
  pin_copies_.fetch_add(1, std::memory_order_relaxed);
  DP_LOG(WARNING) << "table '" << spec_.name() << "': rows [" << begin << ", "
                  << end << ") stayed pinned by a reply in flight for "
                  << absl::FormatDuration(pin_options_.wait)
                  << "; writing to a copy of keys [" << r->range.begin << ", "
                  << r->range.end << ")";
}

void TableShard::PrepareBatchWrite(absl::Span<const Key> keys,
                                   uint32_t vector) {
  if (!dense_ || vector != 0) return;
  for (DenseRange& r : dense_ranges_) {
    if (r.values->num_pins.load(std::memory_order_acquire) == 0) continue;
    Key lo = r.range.end, hi = r.range.begin;
    for (Key k : keys) {
      if (!r.range.Contains(k)) continue;
      lo = std::min(lo, k);
      hi = std::max(hi, k + 1);
    }
    if (lo < hi) PrepareWrite(&r, lo, hi);
  }
}

TableShard::SparseRow TableShard::SparseFind(Key key) {
  auto it = index_.find(key);
  if (it == index_.end()) return {nullptr, nullptr};
  const uint32_t row = it->second;
  const size_t chunk = row / kChunkRows, off = row % kChunkRows;
  return {value_chunks_[chunk].get() + off * width_,
          state_width_ ? state_chunks_[chunk].get() + off * state_width_
                       : nullptr};
}

TableShard::SparseRow TableShard::SparseTouch(Key key) {
  auto [it, inserted] = index_.try_emplace(key, sparse_rows_);
  const uint32_t row = it->second;
  const size_t chunk = row / kChunkRows, off = row % kChunkRows;
  if (inserted) {
    ++sparse_rows_;
    if (chunk == value_chunks_.size()) {
      value_chunks_.emplace_back(new float[kChunkRows * width_]);
      if (state_width_) {
        state_chunks_.emplace_back(new float[kChunkRows * state_width_]);
      }
      UpdateAccounting();
    }
    init_.FillRow(key, width_, value_chunks_[chunk].get() + off * width_);
    if (state_width_) {
      handler_->InitState(state_chunks_[chunk].get() + off * state_width_, 1,
                          width_);
    }
    rows_.store(sparse_rows_, std::memory_order_relaxed);
  }
  return {value_chunks_[chunk].get() + off * width_,
          state_width_ ? state_chunks_[chunk].get() + off * state_width_
                       : nullptr};
}

void TableShard::Put(absl::Span<const Key> keys, const float* values,
                     uint32_t vector) {
  PrepareBatchWrite(keys, vector);
  const size_t bytes = width_ * sizeof(float);
  for (size_t i = 0; i < keys.size(); ++i) {
    float* row = dense_ ? DenseRow(keys[i], nullptr, vector)
                        : SparseTouch(keys[i]).values;
    std::memcpy(row, values + i * width_, bytes);
  }
}

void TableShard::Add(absl::Span<const Key> keys, const float* values,
                     uint32_t vector) {
  PrepareBatchWrite(keys, vector);
  for (size_t i = 0; i < keys.size(); ++i) {
    float* row = dense_ ? DenseRow(keys[i], nullptr, vector)
                        : SparseTouch(keys[i]).values;
    const float* v = values + i * width_;
    for (size_t j = 0; j < width_; ++j) row[j] += v[j];
  }
}

void TableShard::Push(absl::Span<const Key> keys, const float* grads) {
  PrepareBatchWrite(keys, 0);
  for (size_t i = 0; i < keys.size(); ++i) {
    float* state = nullptr;
    float* row;
    if (dense_) {
      row = DenseRow(keys[i], &state);
    } else {
      SparseRow r = SparseTouch(keys[i]);
      row = r.values;
      state = r.state;
    }
    handler_->Apply(row, state, grads + i * width_, 1, width_);
  }
}

void TableShard::Get(absl::Span<const Key> keys, float* out, uint32_t vector) {
  const size_t bytes = width_ * sizeof(float);
  for (size_t i = 0; i < keys.size(); ++i) {
    float* dst = out + i * width_;
    if (dense_) {
      std::memcpy(dst, DenseRow(keys[i], nullptr, vector), bytes);
    } else if (const float* row = SparseFind(keys[i]).values) {
      std::memcpy(dst, row, bytes);
    } else {
      init_.FillRow(keys[i], width_, dst);
    }
  }
}

// Range operations: dense ranges take one contiguous pass; sparse ranges go
// key by key.
namespace {
std::vector<Key> KeysOf(Key begin, Key end) {
  std::vector<Key> keys(end - begin);
  for (Key k = begin; k < end; ++k) keys[k - begin] = k;
  return keys;
}
}  // namespace

void TableShard::PutRange(Key begin, Key end, const float* values,
                          uint32_t vector) {
  if (!dense_) return Put(KeysOf(begin, end), values);
  if (vector == 0) PrepareWrite(DenseRangeOf(begin), begin, end);
  std::memcpy(DenseRow(begin, nullptr, vector), values,
              (end - begin) * width_ * sizeof(float));
}

void TableShard::AddRange(Key begin, Key end, const float* values,
                          uint32_t vector) {
  if (!dense_) return Add(KeysOf(begin, end), values);
  if (vector == 0) PrepareWrite(DenseRangeOf(begin), begin, end);
  float* row = DenseRow(begin, nullptr, vector);
  const size_t n = (end - begin) * width_;
  for (size_t j = 0; j < n; ++j) row[j] += values[j];
}

void TableShard::PushRange(Key begin, Key end, const float* grads) {
  if (!dense_) return Push(KeysOf(begin, end), grads);
  PrepareWrite(DenseRangeOf(begin), begin, end);
  float* state = nullptr;
  float* row = DenseRow(begin, &state);
  handler_->Apply(row, state, grads, end - begin, width_);
}

void TableShard::GetRange(Key begin, Key end, float* out, uint32_t vector) {
  if (!dense_) return Get(KeysOf(begin, end), out);
  std::memcpy(out, DenseRow(begin, nullptr, vector),
              (end - begin) * width_ * sizeof(float));
}

void TableShard::RunVectorCommand(const proto::VectorCommand& cmd,
                                  const VectorKernel& kernel,
                                  double* partials) {
  const Key lo = cmd.begin();
  const Key hi = cmd.end() == 0 ? key_space_.end : cmd.end();
  std::vector<float*> ptrs(num_vectors_, nullptr);
  for (DenseRange& r : dense_ranges_) {
    const Key b = std::max(lo, r.range.begin), e = std::min(hi, r.range.end);
    if (b >= e) continue;
    if (cmd.update() != proto::VectorCommand::NONE && cmd.dst() == 0) {
      PrepareWrite(&r, b, e);
    }
    const size_t offset = (b - r.range.begin) * width_;
    for (uint32_t v = 0; v < num_vectors_; ++v) {
      ptrs[v] = kernel.Uses(v) ? VectorData(&r, v) + offset : nullptr;
    }
    kernel.Apply(ptrs.data(), (e - b) * width_, partials);
  }
  if (cmd.update() == proto::VectorCommand::ZERO && cmd.open_round() > 0) {
    Round& round = rounds_[cmd.dst()];
    round.open = cmd.open_round();
    round.applied.clear();
  }
}

absl::Status TableShard::CheckRound(uint32_t vector, int64_t round) const {
  const int64_t open = rounds_[vector].open;
  if (round > open) {
    return absl::FailedPreconditionError(absl::StrCat(
        "table '", spec_.name(), "': round ", round, " is not open on vector ",
        vector, " (open: ", open, ")"));
  }
  return absl::OkStatus();
}

bool TableShard::FirstInRound(uint32_t vector, int64_t round, uint64_t task,
                              Key first_key) {
  Round& r = rounds_[vector];
  if (round < r.open || !r.applied.insert({task, first_key}).second) {
    dropped_task_adds_.fetch_add(1, std::memory_order_relaxed);
    return false;
  }
  return true;
}

std::vector<float> TableShard::TakeSpare() {
  if (spare_.empty()) return {};
  std::vector<float> v = std::move(spare_.back());
  spare_.pop_back();
  return v;
}

TableShard::SyncResult TableShard::HoldSynced(
    KeyRange part, int rank, Clock clock, absl::Span<const Key> keys,
    const float* grads, size_t num_floats, uint64_t waiter,
    std::vector<uint64_t>* released, const std::function<void()>& apply_alone,
    absl::FunctionRef<void(const PendingStep&)> apply) {
  Clock& next = next_clock_[{part.begin, part.end}];
  if (clock < next) {
    // A backup worker's late push: the step was already taken without it.
    discarded_.fetch_add(1, std::memory_order_relaxed);
    staleness_.Applied(rank, clock);
    return SyncResult::kDiscarded;
  }
  if (apply_alone && spec_.sync_workers() == 1) {
    // One gradient is the whole step: apply it from the request's buffer.
    apply_alone();
    staleness_.Applied(rank, clock);
    next = clock + 1;
    aggregated_.fetch_add(1, std::memory_order_relaxed);
    return SyncResult::kApplied;
  }
  PendingStep& step = pending_[{part.begin, part.end, clock}];
  if (step.by_rank.empty()) step.by_rank.resize(tracked_ranks_);
  if (waiter != 0) step.waiters.push_back(waiter);
  HeldPush& held = step.by_rank[rank];
  if (held.pushed) return SyncResult::kHeld;  // a resend
  held.pushed = true;
  held.keys.assign(keys.begin(), keys.end());
  held.grads = TakeSpare();
  held.grads.assign(grads, grads + num_floats);
  if (++step.count < static_cast<int>(spec_.sync_workers())) {
    return SyncResult::kHeld;
  }
  apply(step);
  for (int r = 0; r < tracked_ranks_; ++r) {
    if (!step.by_rank[r].pushed) continue;
    staleness_.Applied(r, clock);
    spare_.push_back(std::move(step.by_rank[r].grads));
  }
  // The completing request is answered by the caller; a resend of it may
  // have left its token among the waiters as well, which is harmless.
  if (waiter != 0) step.waiters.pop_back();
  released->insert(released->end(), step.waiters.begin(), step.waiters.end());
  pending_.erase({part.begin, part.end, clock});
  next = clock + 1;
  aggregated_.fetch_add(1, std::memory_order_relaxed);
  return SyncResult::kApplied;
}

TableShard::SyncResult TableShard::PushSynced(Key begin, Key end, int rank,
                                             Clock clock, const float* grads,
                                             uint64_t waiter,
                                             std::vector<uint64_t>* released) {
  const size_t n = (end - begin) * width_;
  return HoldSynced(
      KeyRange{begin, end}, rank, clock, {}, grads, n, waiter, released,
      // The aggregated path would apply (0.0f + g) / 1, which equals g
      // except that a -0.0 gradient becomes +0.0; an update rule can tell
      // the two apart only on a parameter that is exactly -0.0, and
      // subtracting from +0.0 or a non-zero value never produces one.
      [&] { PushRange(begin, end, grads); },
      [&](const PendingStep& step) {
        // Sum in rank order, so the result does not depend on arrival order.
        sum_.assign(n, 0.0f);
        for (const HeldPush& g : step.by_rank) {
          if (!g.pushed) continue;
          for (size_t j = 0; j < n; ++j) sum_[j] += g.grads[j];
        }
        const float count = static_cast<float>(step.count);
        for (float& v : sum_) v /= count;
        PushRange(begin, end, sum_.data());
      });
}

TableShard::SyncResult TableShard::PushSyncedKeys(absl::Span<const Key> keys,
                                                 int rank, Clock clock,
                                                 const float* grads) {
  std::vector<uint64_t> no_waiters;  // key batches are never push-pulled
  return HoldSynced(
      key_space_, rank, clock, keys, grads, keys.size() * width_, 0,
      &no_waiters,
      // No shortcut: even one rank's batch is summed per key (repeats
      // included) and applied in ascending key order.
      nullptr,
      [&](const PendingStep& step) {
        // The union of the ranks' keys, ascending: rows are then created
        // in the same order on every run, not only given the same values.
        std::vector<Key> all;
        for (const HeldPush& p : step.by_rank) {
          all.insert(all.end(), p.keys.begin(), p.keys.end());
        }
        std::sort(all.begin(), all.end());
        all.erase(std::unique(all.begin(), all.end()), all.end());
        absl::flat_hash_map<Key, size_t> slot;
        slot.reserve(all.size());
        for (size_t i = 0; i < all.size(); ++i) slot[all[i]] = i;
        // Each key's sum starts at 0 and adds the ranks' gradients in rank
        // order, as the range form does; a rank that did not push a key
        // adds nothing (a zero gradient), so the mean is over every rank.
        std::vector<float> mean(all.size() * width_, 0.0f);
        for (const HeldPush& p : step.by_rank) {
          for (size_t i = 0; i < p.keys.size(); ++i) {
            float* dst = mean.data() + slot[p.keys[i]] * width_;
            const float* g = p.grads.data() + i * width_;
            for (size_t j = 0; j < width_; ++j) dst[j] += g[j];
          }
        }
        const float count = static_cast<float>(step.count);
        for (float& v : mean) v /= count;
        Push(all, mean.data());
      });
}

void TableShard::RecordApplied(int rank, Clock clock) {
  if (tracked_ranks_ > 0) staleness_.Applied(rank, clock);
}

Clock TableShard::ObservePull(Clock clock) {
  if (tracked_ranks_ == 0) return 0;
  const Clock s = staleness_.Observe(clock);
  tracked_pulls_.fetch_add(1, std::memory_order_relaxed);
  max_staleness_.store(staleness_.max_observed(), std::memory_order_relaxed);
  return s;
}

uint64_t TableShard::value_bytes() const {
  return rows() * width_ * sizeof(float);
}

uint64_t TableShard::state_bytes() const {
  return state_bytes_.load(std::memory_order_relaxed);
}

uint64_t TableShard::allocated_bytes() const {
  return allocated_bytes_.load(std::memory_order_relaxed);
}

void TableShard::UpdateAccounting() {
  uint64_t values = 0, state = 0;
  for (const DenseRange& r : dense_ranges_) {
    values += r.rows() * width_ * sizeof(float);
    for (const auto& v : r.vectors) {
      if (v != nullptr) values += r.rows() * width_ * sizeof(float);
    }
    if (r.state != nullptr) state += r.rows() * state_width_ * sizeof(float);
  }
  values += value_chunks_.size() * kChunkRows * width_ * sizeof(float);
  state += state_chunks_.size() * kChunkRows * state_width_ * sizeof(float);
  // The sparse index: a slot holds a key and a row number, plus one control
  // byte.
  const uint64_t index = index_.capacity() * (sizeof(Key) + sizeof(uint32_t) + 1);
  state_bytes_.store(state, std::memory_order_relaxed);
  allocated_bytes_.store(values + state + index, std::memory_order_relaxed);
}

}  // namespace server_internal
}  // namespace downpour
