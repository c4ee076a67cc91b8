#include "server/internal/range_store.h"

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "common/status_macros.h"

namespace downpour {
namespace server_internal {

absl::StatusOr<std::unique_ptr<const TableLayout>> TableLayout::Create(
    const proto::TableSpec& spec, const PluginRegistry* plugins,
    const PinOptions& pins, storage::ColdStore* cold_store) {
  if (spec.width() == 0) return absl::InvalidArgumentError("width is 0");
  DP_ASSIGN_OR_RETURN(std::unique_ptr<UpdateHandler> handler,
                      CreateHandler(spec.handler(), plugins), "table '",
                      spec.name(), "'");
  DP_ASSIGN_OR_RETURN(Initializer init, Initializer::Create(spec.init()),
                      "table '", spec.name(), "'");
  std::unique_ptr<TableLayout> l(new TableLayout(init));
  l->spec = spec;
  l->width = spec.width();
  l->dense = spec.kind() == proto::DENSE;
  l->num_vectors =
      static_cast<uint32_t>(std::max(1, l->dense ? spec.vectors_size() : 1));
  l->state_width = handler->StateWidth(l->width);
  l->handler = std::move(handler);
  l->pins = pins;
  l->key_space = KeyRange{0, l->dense ? spec.num_keys() : kKeySpaceEnd};
  if (!l->dense) {
    l->bounds =
        RangeBounds::Of(spec, l->width, l->state_width, 0, kKeySpaceEnd);
    if (l->bounds.cold && cold_store == nullptr) {
      return absl::FailedPreconditionError(absl::StrCat(
          "table '", spec.name(),
          "' keeps a cold tier (SparseBounds.cold_tier) but this server has "
          "no --data_dir to keep it in"));
    }
    l->cold_store = l->bounds.cold ? cold_store : nullptr;
  }
  return std::unique_ptr<const TableLayout>(std::move(l));
}

size_t RowChunk::ExpectedFloats(size_t width, size_t state_width) const {
  return count * (width * (1 + vectors.size()) + (has_state ? state_width : 0));
}

RangeStore::RangeStore(const TableLayout* layout, KeyRange range)
    : layout_(layout), range_(range) {
  if (layout_->dense) {
    // Uninitialized allocation, then one pass by the initializer: each page
    // is written once.
    values_ = std::make_shared<PinnedArray>(range_.size() * width());
    layout_->init.Fill(range_.begin, range_.size(), width(),
                       values_->data.get());
    vectors_.resize(layout_->num_vectors - 1);
    rows_.store(range_.size());
  } else {
    std::unique_ptr<storage::ColdRange> cold;
    if (layout_->cold_store != nullptr) {
      cold = std::make_unique<storage::ColdRange>(
          layout_->cold_store, layout_->spec.id(), range_.begin,
          width() + layout_->state_width);
      // A new store holds no rows: what an earlier store of this range left
      // in the tier (a backup copying its range afresh) goes.
      absl::Status cleared = cold->Clear();
      if (!cleared.ok()) {
        DP_LOG(WARNING) << "table '" << layout_->spec.name()
                        << "': cannot clear the cold tier of keys ["
                        << range_.begin << ", " << range_.end
                        << "): " << cleared;
      }
    }
    sparse_ = std::make_unique<SparseRows>(
        &layout_->init, layout_->handler.get(), width(), range_.begin,
        range_.end, layout_->BoundsOf(range_), std::move(cold));
  }
  UpdateAccounting();
}

void RangeStore::EnsureDenseState() {
  if (layout_->state_width == 0 || state_ != nullptr) return;
  state_.reset(new float[range_.size() * layout_->state_width]);
  layout_->handler->InitState(state_.get(), range_.size(), width());
  UpdateAccounting();
}

float* RangeStore::VectorData(uint32_t vector) {
  if (vector == 0) return values_->data.get();
  std::unique_ptr<float[]>& v = vectors_[vector - 1];
  if (v == nullptr) {
    v.reset(new float[range_.size() * width()]());
    UpdateAccounting();
  }
  return v.get();
}

float* RangeStore::DenseRow(size_t row, uint32_t vector, float** state) {
  if (state != nullptr) {
    EnsureDenseState();
    *state = layout_->state_width ? state_.get() + row * layout_->state_width
                                  : nullptr;
  }
  return VectorData(vector) + row * width();
}

std::optional<RangeStore::PinnedRows> RangeStore::PinRows(Key begin, Key end) {
  const size_t bytes = (end - begin) * width() * sizeof(float);
  if (!layout_->dense || bytes < layout_->pins.min_bytes) return std::nullopt;
  if (copy_replies_until_ > absl::InfinitePast() &&
      absl::Now() < copy_replies_until_) {
    return std::nullopt;
  }
  std::shared_ptr<PinnedArray> array = values_;
  const std::pair<size_t, size_t> rows{begin - range_.begin,
                                       end - range_.begin};
  {
    absl::MutexLock lock(&array->mu);
    array->pins.push_back(rows);
    array->num_pins.fetch_add(1, std::memory_order_relaxed);
  }
  live_pins_->fetch_add(1, std::memory_order_relaxed);
  zero_copy_replies_.fetch_add(1, std::memory_order_relaxed);
  const float* data = array->data.get() + rows.first * width();
  // The callback holds the array (not the store): it may run on ZeroMQ's
  // I/O thread after the store is gone.
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

void RangeStore::PrepareWrite(Key begin, Key end) {
  PinnedArray* array = values_.get();
  // The common case: nothing pinned, no lock.
  if (array->num_pins.load(std::memory_order_acquire) == 0) return;
  const size_t first = begin - range_.begin, last = end - range_.begin;
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
    copy_replies_until_ = absl::Now() + layout_->pins.copy_after_wait;
    clear = array->mu.AwaitWithTimeout(absl::Condition(&unpinned),
                                       layout_->pins.wait);
  }
  if (clear) return;
  // The peer is not reading its reply. Do not stall every writer behind it:
  // write to a copy; the pinned array lives on until its pins are released.
  const size_t floats = range_.size() * width();
  auto fresh = std::make_shared<PinnedArray>(floats);
  std::memcpy(fresh->data.get(), array->data.get(), floats * sizeof(float));
  values_ = std::move(fresh);
  pin_copies_.fetch_add(1, std::memory_order_relaxed);
  DP_LOG(WARNING) << "table '" << layout_->spec.name() << "': rows [" << begin
                  << ", " << end << ") stayed pinned by a reply in flight for "
                  << absl::FormatDuration(layout_->pins.wait)
                  << "; writing to a copy of keys [" << range_.begin << ", "
                  << range_.end << ")";
}

void RangeStore::PrepareBatchWrite(absl::Span<const Key> keys,
                                   uint32_t vector) {
  if (!layout_->dense || vector != 0 || keys.empty()) return;
  if (values_->num_pins.load(std::memory_order_acquire) == 0) return;
  const auto [lo, hi] = std::minmax_element(keys.begin(), keys.end());
  PrepareWrite(*lo, *hi + 1);
}

void RangeStore::Put(absl::Span<const Key> keys, const float* values,
                     uint32_t vector) {
  PrepareBatchWrite(keys, vector);
  const size_t bytes = width() * sizeof(float);
  for (size_t i = 0; i < keys.size(); ++i) {
    PutRow(keys[i], values + i * width(), bytes, vector);
  }
}

void RangeStore::PutRow(Key key, const float* values, size_t bytes,
                        uint32_t vector) {
  const size_t sw = layout_->state_width;
  if (layout_->dense) {
    const size_t row = key - range_.begin;
    std::memcpy(DenseRow(row, vector), values, bytes);
    // New values start the update rule over: a row put after a bad push
    // (an exploded accumulator) is not poisoned by its old state.
    if (vector == 0 && sw > 0 && state_ != nullptr) {
      layout_->handler->InitState(state_.get() + row * sw, 1, width());
    }
    return;
  }
  const bool existed = static_cast<bool>(sparse_->Find(key));
  const SparseRows::Row r = sparse_->Touch(key, SparseRows::Write::kPut);
  std::memcpy(r.values, values, bytes);
  if (existed && r.state != nullptr) {
    layout_->handler->InitState(r.state, 1, width());
  }
}

void RangeStore::Add(absl::Span<const Key> keys, const float* values,
                     uint32_t vector) {
  if (!layout_->dense) {
    const size_t w = width();
    sparse_->TouchBatch(keys, SparseRows::Write::kAdd,
                        [&](size_t i, SparseRows::Row r) {
                          const float* v = values + i * w;
                          for (size_t j = 0; j < w; ++j) r.values[j] += v[j];
                        });
    return;
  }
  PrepareBatchWrite(keys, vector);
  for (size_t i = 0; i < keys.size(); ++i) {
    float* row = layout_->dense
                     ? DenseRow(keys[i] - range_.begin, vector)
                     : sparse_->Touch(keys[i], SparseRows::Write::kAdd).values;
    const float* v = values + i * width();
    for (size_t j = 0; j < width(); ++j) row[j] += v[j];
  }
}

void RangeStore::Push(absl::Span<const Key> keys, const float* grads) {
  if (!layout_->dense) {
    const UpdateHandler& h = *layout_->handler;
    const size_t w = width();
    // Pushes of keys not yet admitted are counted, not stored: no row.
    sparse_->TouchBatch(keys, SparseRows::Write::kPush,
                        [&](size_t i, SparseRows::Row r) {
                          h.Apply(r.values, r.state, grads + i * w, 1, w);
                        });
    return;
  }
  PrepareBatchWrite(keys, 0);
  float* state = nullptr;
  float* rows = DenseRow(0, 0, &state);
  layout_->handler->ApplyScattered(rows, state, keys.data(), range_.begin,
                                   keys.size(), grads, width());
}

absl::Status RangeStore::Get(absl::Span<const Key> keys, float* out,
                             uint32_t vector) {
  const size_t bytes = width() * sizeof(float);
  if (layout_->dense) {
    for (size_t i = 0; i < keys.size(); ++i) {
      std::memcpy(out + i * width(), DenseRow(keys[i] - range_.begin, vector),
                  bytes);
    }
    return absl::OkStatus();
  }
  sparse_->StartRequest();
  return sparse_->ReadBatch(keys, out);
}

// Range operations: dense ranges take one contiguous pass; sparse ranges go
// key by key (without listing the keys first: a range may be huge and
// mostly absent).

void RangeStore::PutRange(Key begin, Key end, const float* values,
                          uint32_t vector) {
  const size_t w = width();
  if (!layout_->dense) {
    for (Key k = begin; k < end; ++k) {
      PutRow(k, values + (k - begin) * w, w * sizeof(float), vector);
    }
    return;
  }
  if (vector == 0) PrepareWrite(begin, end);
  std::memcpy(DenseRow(begin - range_.begin, vector), values,
              (end - begin) * w * sizeof(float));
  const size_t sw = layout_->state_width;
  if (vector == 0 && sw > 0 && state_ != nullptr) {
    // As Put: new values start the update rule over.
    layout_->handler->InitState(state_.get() + (begin - range_.begin) * sw,
                                end - begin, w);
  }
}

void RangeStore::AddRange(Key begin, Key end, const float* values,
                          uint32_t vector) {
  const size_t w = width();
  if (!layout_->dense) {
    for (Key k = begin; k < end; ++k) {
      float* row = sparse_->Touch(k, SparseRows::Write::kAdd).values;
      const float* v = values + (k - begin) * w;
      for (size_t j = 0; j < w; ++j) row[j] += v[j];
    }
    return;
  }
  if (vector == 0) PrepareWrite(begin, end);
  float* row = DenseRow(begin - range_.begin, vector);
  const size_t n = (end - begin) * w;
  for (size_t j = 0; j < n; ++j) row[j] += values[j];
}

void RangeStore::PushRange(Key begin, Key end, const float* grads) {
  const size_t w = width();
  if (!layout_->dense) {
    for (Key k = begin; k < end; ++k) {
      const SparseRows::Row r = sparse_->Touch(k, SparseRows::Write::kPush);
      if (!r) continue;  // counted towards admission, not stored
      layout_->handler->Apply(r.values, r.state, grads + (k - begin) * w, 1, w);
    }
    return;
  }
  PrepareWrite(begin, end);
  float* state = nullptr;
  float* row = DenseRow(begin - range_.begin, 0, &state);
  layout_->handler->Apply(row, state, grads, end - begin, w);
}

absl::Status RangeStore::GetRange(Key begin, Key end, float* out,
                                  uint32_t vector) {
  const size_t w = width();
  if (!layout_->dense) {
    // Absent rows read as their initial values and are not created.
    sparse_->StartRequest();
    absl::Status status;
    for (Key k = begin; k < end; ++k) {
      absl::Status s = sparse_->Read(k, out + (k - begin) * w);
      if (!s.ok() && status.ok()) status = s;
    }
    return status;
  }
  std::memcpy(out, DenseRow(begin - range_.begin, vector),
              (end - begin) * w * sizeof(float));
  return absl::OkStatus();
}

void RangeStore::RunVector(Key lo, Key hi, const VectorKernel& kernel,
                           bool writes_params, double* partials) {
  const Key b = std::max(lo, range_.begin), e = std::min(hi, range_.end);
  if (!layout_->dense || b >= e) return;
  if (writes_params) PrepareWrite(b, e);
  const size_t offset = (b - range_.begin) * width();
  std::vector<float*> ptrs(layout_->num_vectors, nullptr);
  for (uint32_t v = 0; v < layout_->num_vectors; ++v) {
    ptrs[v] = kernel.Uses(v) ? VectorData(v) + offset : nullptr;
  }
  kernel.Apply(ptrs.data(), (e - b) * width(), partials);
}

std::optional<uint64_t> RangeStore::ExportRows(uint64_t cursor,
                                               size_t max_bytes, RowChunk* out,
                                               bool with_cold) const {
  const size_t w = width(), sw = layout_->state_width;
  if (!layout_->dense) {
    SparseRows::Chunk c;
    std::optional<uint64_t> next =
        sparse_->Export(cursor, max_bytes, with_cold, &c);
    out->vectors.clear();
    out->first_key = 0;
    out->kind = c.kind;
    out->count = c.keys.size();
    out->keys = std::move(c.keys);
    out->data = std::move(c.data);
    out->has_state = sw > 0 && c.kind != proto::RowChunkInfo::PENDING;
    return next;
  }
  const uint64_t total = range_.size();
  out->keys.clear();
  out->vectors.clear();
  out->data.clear();
  out->kind = proto::RowChunkInfo::ROWS;
  const bool has_state = sw > 0 && state_ != nullptr;
  for (uint32_t v = 1; v < layout_->num_vectors; ++v) {
    if (vectors_[v - 1] != nullptr) out->vectors.push_back(v);
  }
  out->has_state = has_state;
  const size_t row_bytes =
      sizeof(float) * (w * (1 + out->vectors.size()) + (has_state ? sw : 0));
  const uint64_t n = std::min<uint64_t>(
      total - std::min(cursor, total),
      std::max<uint64_t>(1, max_bytes / std::max<size_t>(1, row_bytes)));
  out->count = n;
  out->first_key = range_.begin + cursor;
  out->data.resize(out->ExpectedFloats(w, sw));
  float* dst = out->data.data();
  std::memcpy(dst, values_->data.get() + cursor * w, n * w * sizeof(float));
  dst += n * w;
  if (has_state) {
    std::memcpy(dst, state_.get() + cursor * sw, n * sw * sizeof(float));
    dst += n * sw;
  }
  for (uint32_t v : out->vectors) {
    std::memcpy(dst, vectors_[v - 1].get() + cursor * w, n * w * sizeof(float));
    dst += n * w;
  }
  const uint64_t next = cursor + n;
  if (next >= total) return std::nullopt;
  return next;
}

absl::Status RangeStore::ImportRows(const RowChunkView& c) {
  const size_t w = width(), sw = layout_->state_width;
  auto bad = [&](absl::string_view why) {
    return absl::DataLossError(
        absl::StrCat("table '", layout_->spec.name(), "' keys [", range_.begin,
                     ", ", range_.end, "): malformed row chunk: ", why));
  };
  if (layout_->dense && c.kind != proto::RowChunkInfo::ROWS) {
    return bad("a dense range holds rows only");
  }
  if (c.data.size() != c.ExpectedFloats(w, sw)) {
    return bad(absl::StrCat(c.data.size(), " floats, expected ",
                            c.ExpectedFloats(w, sw)));
  }
  if (c.has_state && sw == 0) return bad("handler state for a stateless rule");
  for (size_t i = 0; i < c.vectors.size(); ++i) {
    if (!layout_->dense || c.vectors[i] == 0 ||
        c.vectors[i] >= layout_->num_vectors ||
        (i > 0 && c.vectors[i] <= c.vectors[i - 1])) {
      return bad(absl::StrCat("vector ", c.vectors[i]));
    }
  }
  if (layout_->dense) {
    if (!c.keys.empty() || c.first_key < range_.begin ||
        c.first_key > range_.end || c.count > range_.end - c.first_key) {
      return bad(absl::StrCat(c.count, " rows from key ", c.first_key));
    }
    const size_t row = c.first_key - range_.begin, n = c.count;
    PrepareWrite(c.first_key, c.first_key + n);
    const float* src = c.data.data();
    std::memcpy(values_->data.get() + row * w, src, n * w * sizeof(float));
    src += n * w;
    if (sw > 0 && (c.has_state || state_ != nullptr)) {
      EnsureDenseState();
      if (c.has_state) {
        std::memcpy(state_.get() + row * sw, src, n * sw * sizeof(float));
        src += n * sw;
      } else {
        layout_->handler->InitState(state_.get() + row * sw, n, w);
      }
    }
    size_t next_vector = 0;
    for (uint32_t v = 1; v < layout_->num_vectors; ++v) {
      const bool sent =
          next_vector < c.vectors.size() && c.vectors[next_vector] == v;
      if (sent) {
        std::memcpy(VectorData(v) + row * w, src, n * w * sizeof(float));
        src += n * w;
        ++next_vector;
      } else if (vectors_[v - 1] != nullptr) {
        std::fill_n(vectors_[v - 1].get() + row * w, n * w, 0.0f);
      }
    }
    return absl::OkStatus();
  }
  if (c.keys.size() != c.count) return bad("key count");
  if (c.kind != proto::RowChunkInfo::PENDING && c.has_state != (sw > 0)) {
    return bad("a sparse chunk carries the handler state, and only then");
  }
  return sparse_->Import(c.kind, c.keys, c.data);
}

uint64_t RangeStore::value_bytes() const {
  return rows() * width() * sizeof(float);
}

void RangeStore::UpdateAccounting() {
  const size_t w = width(), sw = layout_->state_width;
  uint64_t values = 0, state = 0;
  if (layout_->dense) {
    values += range_.size() * w * sizeof(float);
    for (const auto& v : vectors_) {
      if (v != nullptr) values += range_.size() * w * sizeof(float);
    }
    if (state_ != nullptr) state += range_.size() * sw * sizeof(float);
  }
  state_bytes_.store(state, std::memory_order_relaxed);
  allocated_bytes_.store(values + state, std::memory_order_relaxed);
}

void RangeStore::AddStats(proto::TableStats* out) const {
  if (sparse_ != nullptr) {
    const SparseRows& r = *sparse_;
    out->set_row_cap(out->row_cap() + r.bounds().max_rows);
    out->set_evicted_rows(out->evicted_rows() + r.evicted());
    out->set_expired_rows(out->expired_rows() + r.expired());
    out->set_admitted_rows(out->admitted_rows() + r.admitted());
    out->set_pending_ids(out->pending_ids() + r.pending_ids());
    out->set_cold_rows(out->cold_rows() + r.cold_rows());
    out->set_refused_writes(out->refused_writes() + r.refused());
  }
  out->set_rows(out->rows() + rows());
  out->set_value_bytes(out->value_bytes() + value_bytes());
  out->set_state_bytes(out->state_bytes() + state_bytes());
  out->set_allocated_bytes(out->allocated_bytes() + allocated_bytes());
  out->set_zero_copy_replies(out->zero_copy_replies() + zero_copy_replies());
  out->set_pin_waits(out->pin_waits() + pin_waits());
  out->set_pin_copies(out->pin_copies() + pin_copies());
  out->set_pinned_replies(out->pinned_replies() + pinned_replies());
}

}  // namespace server_internal
}  // namespace downpour
