// The storage of one key range of one table on one server: the values, the
// update handler's per-row state and the table's named vectors. What a
// range holds besides its rows (BSP steps in flight, task rounds, the
// writers it has heard from) lives beside it, in the table shard.
//
//   auto layout = TableLayout::Create(spec, &plugins);
//   RangeStore store(layout->get(), KeyRange{0, 1000});
//   store.PushRange(0, 10, grads);             // the handler applies them
//   store.GetRange(0, 10, out);
//
// Dense ranges keep each vector as one contiguous array (rows * width
// floats; handler state and the named vectors other than 0 are allocated
// on first use). Sparse ranges keep rows in fixed-size chunks indexed by a
// hash map, so growth never copies the rows already stored; reading an
// absent row yields its initial values and does not create it.
//
// Zero-copy reads (dense, vector 0): PinRows hands out rows for a reply to
// reference while the transport sends it. Until the reply releases its pin,
// a write to any pinned row waits (a reply is never torn and no write is
// lost); after a writer had to wait, the store copies its replies for a
// while instead. A pin that outlives PinOptions::wait (a peer that stopped
// reading) makes the writer move the range to a fresh copy of the array and
// go on (copy-on-write); the old array lives until its last pin goes.
//
// Copying a range elsewhere (a replica catching up, a checkpoint):
// ExportRows reads the rows in chunks, in an order of its own, and
// ImportRows overwrites rows with a chunk's values, handler state and named
// vectors, creating them if absent. A row's chunk carries everything about
// the row, so a copy made while writes go on is exact if the receiver
// applies, after each chunk, the writes made after that chunk was read.
//
// Not thread-safe: one thread uses a store at a time, except that a pin's
// release may run on any thread. The counters are atomics, readable from
// any thread.
#ifndef DOWNPOUR_SERVER_INTERNAL_RANGE_STORE_H_
#define DOWNPOUR_SERVER_INTERNAL_RANGE_STORE_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "common/types.h"
#include "handlers/handler.h"
#include "handlers/initializer.h"
#include "handlers/plugin_registry.h"
#include "handlers/vector_kernel.h"
#include "proto/downpour.pb.h"
#include "server/internal/sparse_rows.h"
#include "storage/cold_store.h"

namespace downpour {
namespace server_internal {

struct KeyRange {
  Key begin;
  Key end;  // exclusive
  bool Contains(Key k) const { return k >= begin && k < end; }
  Key size() const { return end - begin; }
  bool operator==(const KeyRange& o) const {
    return begin == o.begin && end == o.end;
  }
};

// How dense range reads are shared with the transport without copying.
struct PinOptions {
  // Replies of at least this many bytes reference the table (smaller ones
  // are cheaper to copy than to pin).
  size_t min_bytes = size_t{256} << 10;
  // How long a writer waits for pins on its rows before copying the array.
  absl::Duration wait = absl::Seconds(1);
  // After a writer waited, replies are copied for this long: a workload that
  // mixes writes with reads of the same rows pays a copy, not a wait.
  absl::Duration copy_after_wait = absl::Seconds(1);
};

// What every range of a table shares: its spec and the rules built from it.
// Immutable after Create; thread-safe.
struct TableLayout {
  // kInvalidArgument / kNotFound for a bad handler or initializer spec, or
  // a width of 0; kFailedPrecondition for a cold tier without `cold_store`.
  // `plugins` (may be null) and `cold_store` (null: this server has no
  // --data_dir) must outlive the layout.
  static absl::StatusOr<std::unique_ptr<const TableLayout>> Create(
      const proto::TableSpec& spec, const PluginRegistry* plugins,
      const PinOptions& pins = {}, storage::ColdStore* cold_store = nullptr);

  proto::TableSpec spec;
  size_t width = 0;
  bool dense = true;
  // Named vectors (TableSpec.vectors): at least 1, the parameters; dense
  // tables only.
  uint32_t num_vectors = 1;
  std::unique_ptr<UpdateHandler> handler;
  size_t state_width = 0;  // handler->StateWidth(width)
  Initializer init;
  PinOptions pins;
  // The table's whole key space, [0, num_keys) or [0, kKeySpaceEnd).
  KeyRange key_space{0, 0};
  // Sparse tables: the table's bounds (TableSpec.bounds) over its whole
  // key space, and where the cold tier lives (null without one).
  RangeBounds bounds;
  storage::ColdStore* cold_store = nullptr;

  // The bounds of the table's range `range`: its caps follow its share of
  // the key space, so that a piece of a split range, or neighbours merged,
  // hold the same caps on every server whenever it first saw the table.
  RangeBounds BoundsOf(KeyRange range) const {
    return dense ? RangeBounds()
                 : RangeBounds::Of(spec, width, state_width, range.begin,
                                   range.end);
  }

 private:
  explicit TableLayout(Initializer i) : init(i) {}
};

// Rows of a range, as ExportRows reads them and ImportRows writes them.
struct RowChunk {
  // Dense: the rows first_key .. first_key + count - 1 (keys stays empty).
  // Sparse: the rows of `keys` (count == keys.size()).
  Key first_key = 0;
  uint64_t count = 0;
  std::vector<Key> keys;
  // data holds, one block after another, count rows of: vector 0 (the
  // values, count * width floats), then the handler state (count *
  // state_width) if has_state, then each vector of `vectors` (count * width
  // each). A block left out stands for its initial contents (initial handler
  // state, zeros for a named vector).
  bool has_state = false;
  std::vector<uint32_t> vectors;  // named vectors > 0 included, ascending
  std::vector<float> data;
  // Bounded sparse ranges: rows in memory, cold rows (same layout), or
  // admission counters (one float per key in `data`).
  proto::RowChunkInfo::Kind kind = proto::RowChunkInfo::ROWS;

  // Floats `data` must hold for the fields above.
  size_t ExpectedFloats(size_t width, size_t state_width) const;
};

// A RowChunk's fields without owning them (e.g. the frames of a message).
struct RowChunkView {
  RowChunkView() = default;
  RowChunkView(const RowChunk& c)  // NOLINT: implicit, a view of it
      : first_key(c.first_key),
        count(c.count),
        keys(c.keys),
        has_state(c.has_state),
        vectors(c.vectors),
        data(c.data),
        kind(c.kind) {}
  Key first_key = 0;
  uint64_t count = 0;
  absl::Span<const Key> keys;
  bool has_state = false;
  absl::Span<const uint32_t> vectors;
  absl::Span<const float> data;
  proto::RowChunkInfo::Kind kind = proto::RowChunkInfo::ROWS;

  size_t ExpectedFloats(size_t width, size_t state_width) const {
    if (kind == proto::RowChunkInfo::PENDING) return count;
    return count *
           (width * (1 + vectors.size()) + (has_state ? state_width : 0));
  }
};

class RangeStore {
 public:
  // A dense store allocates its rows and fills them with the initializer's
  // values; a sparse store starts empty. `layout` must outlive the store.
  // REQUIRES: `range` lies inside layout->key_space.
  RangeStore(const TableLayout* layout, KeyRange range);
  RangeStore(const RangeStore&) = delete;
  RangeStore& operator=(const RangeStore&) = delete;

  const TableLayout& layout() const { return *layout_; }
  KeyRange range() const { return range_; }

  // Batch operations on vector `vector` (0: the parameters). REQUIRES:
  // every key lies in range(), vector < num_vectors, and the value arrays
  // hold keys.size() * width floats. Keys may repeat; repeats apply in
  // order (an add or push of key k twice adds or applies twice). Named
  // vectors start as zeros. A put of the parameters also resets the rows'
  // handler state to its initial value: new values start the update rule
  // over (a row put after a bad push is not poisoned by what its state
  // kept).
  void Put(absl::Span<const Key> keys, const float* values,
           uint32_t vector = 0);
  void Add(absl::Span<const Key> keys, const float* values,
           uint32_t vector = 0);
  void Push(absl::Span<const Key> keys, const float* grads);
  // A sparse read may find a row in the cold tier: a failing tier is the
  // error (the row then reads as its initial values).
  absl::Status Get(absl::Span<const Key> keys, float* out, uint32_t vector = 0);

  // The same over the keys [begin, end). REQUIRES: [begin, end) lies in
  // range().
  void PutRange(Key begin, Key end, const float* values, uint32_t vector = 0);
  void AddRange(Key begin, Key end, const float* values, uint32_t vector = 0);
  void PushRange(Key begin, Key end, const float* grads);
  absl::Status GetRange(Key begin, Key end, float* out, uint32_t vector = 0);

  // Parameter rows [begin, end) for a reply to send without copying.
  // `release` must run exactly once (on any thread) when the transport no
  // longer reads `data`; until then writes to these rows wait. The memory
  // stays valid until then even if the store is destroyed. nullopt when the
  // reply should be copied instead: a sparse range, fewer than
  // PinOptions::min_bytes, or a writer waited recently. REQUIRES: [begin,
  // end) lies in range().
  struct PinnedRows {
    const float* data;
    size_t bytes;
    std::function<void()> release;
  };
  std::optional<PinnedRows> PinRows(Key begin, Key end);

  // Runs `kernel` on the rows of [lo, hi) ∩ range() (dense only), adding
  // its dot products to `partials`. `writes_params`: the command updates
  // vector 0, so it waits for pins like any write.
  void RunVector(Key lo, Key hi, const VectorKernel& kernel, bool writes_params,
                 double* partials);

  // Reads rows into `out` (replacing its contents), starting at `cursor`
  // (0 for the first chunk) and stopping after about `max_bytes` of floats
  // (at least one row). Returns the cursor of the next chunk, or nullopt
  // when this chunk ends the rows present now. Rows created after an export
  // started come after those present when it started, so a walk from 0
  // until nullopt sees every row. Sparse ranges walk the rows in memory,
  // then (bounded tables) admission counters and, with `with_cold`, the
  // cold tier's rows (SparseRows::Export); dense ones walk keys in order.
  std::optional<uint64_t> ExportRows(uint64_t cursor, size_t max_bytes,
                                     RowChunk* out,
                                     bool with_cold = true) const;
  // Overwrites the chunk's rows (creating absent sparse rows). kDataLoss
  // if the chunk is malformed (keys outside range(), a block of the wrong
  // size, a vector the table lacks), and then nothing changes.
  absl::Status ImportRows(const RowChunkView& chunk);

  // Adds this range's storage figures to `out` (rows, bytes, zero-copy
  // counters, a bounded table's counts); any thread.
  void AddStats(proto::TableStats* out) const;
  // A sparse range's rows (null for a dense one): bounded tables' writes
  // are prepared there (SparseRows::Prepare) and a backup applies its
  // primary's evictions there.
  SparseRows* sparse() { return sparse_.get(); }
  const SparseRows* sparse() const { return sparse_.get(); }

  // Rows held (dense: all of the range; sparse: those created).
  uint64_t rows() const {
    return sparse_ != nullptr ? sparse_->rows()
                              : rows_.load(std::memory_order_relaxed);
  }
  uint64_t value_bytes() const;
  uint64_t state_bytes() const {
    return sparse_ != nullptr ? sparse_->state_bytes()
                              : state_bytes_.load(std::memory_order_relaxed);
  }
  // Bytes the storage holds, capacity and index included.
  uint64_t allocated_bytes() const {
    return sparse_ != nullptr
               ? sparse_->allocated_bytes()
               : allocated_bytes_.load(std::memory_order_relaxed);
  }
  // Pins not yet released.
  int64_t pinned_replies() const {
    return live_pins_->load(std::memory_order_relaxed);
  }
  uint64_t zero_copy_replies() const {
    return zero_copy_replies_.load(std::memory_order_relaxed);
  }
  uint64_t pin_waits() const {
    return pin_waits_.load(std::memory_order_relaxed);
  }
  uint64_t pin_copies() const {
    return pin_copies_.load(std::memory_order_relaxed);
  }

 private:
  // A dense range's parameters, shared with the replies that pin its rows.
  struct PinnedArray {
    explicit PinnedArray(size_t floats) : data(new float[floats]) {}
    // A raw array rather than a vector: a vector would zero every page
    // before the initializer writes it again, and fresh pages are slow.
    const std::unique_ptr<float[]> data;
    absl::Mutex mu;
    // Row intervals [first, last) (from the range's start) that replies in
    // flight reference; one entry per pin.
    std::vector<std::pair<size_t, size_t>> pins ABSL_GUARDED_BY(mu);
    // pins.size(), readable without the lock: writers skip the lock when 0.
    std::atomic<int64_t> num_pins{0};
  };

  size_t width() const { return layout_->width; }
  // Dense: row `row` (from the range's start) of `vector`, allocating a
  // named vector on first use; with `state`, also the row's handler state
  // (allocated on first use).
  float* DenseRow(size_t row, uint32_t vector = 0, float** state = nullptr);
  float* VectorData(uint32_t vector);
  // Put of one row (see Put); `bytes` = width * sizeof(float).
  void PutRow(Key key, const float* values, size_t bytes, uint32_t vector);
  void EnsureDenseState();
  // Call before writing parameter rows [begin, end): waits for pins on
  // them, or copies the array (see PinOptions::wait).
  void PrepareWrite(Key begin, Key end);
  // The same for the span of rows a batch touches (vector 0 only).
  void PrepareBatchWrite(absl::Span<const Key> keys, uint32_t vector);
  void UpdateAccounting();

  const TableLayout* const layout_;
  const KeyRange range_;

  // Dense storage.
  std::shared_ptr<PinnedArray> values_;  // vector 0; replaced on a stuck pin
  std::unique_ptr<float[]> state_;       // null until the first push
  // Named vectors 1, 2, ...: each null until first touched.
  std::vector<std::unique_ptr<float[]>> vectors_;
  absl::Time copy_replies_until_ = absl::InfinitePast();
  // Pins not yet released, shared with the release callbacks (which may
  // outlive the store).
  const std::shared_ptr<std::atomic<int64_t>> live_pins_ =
      std::make_shared<std::atomic<int64_t>>(0);

  // Sparse storage.
  std::unique_ptr<SparseRows> sparse_;

  std::atomic<uint64_t> zero_copy_replies_{0};
  std::atomic<uint64_t> pin_waits_{0};
  std::atomic<uint64_t> pin_copies_{0};
  std::atomic<uint64_t> rows_{0};
  std::atomic<uint64_t> allocated_bytes_{0};
  std::atomic<uint64_t> state_bytes_{0};
};

}  // namespace server_internal
}  // namespace downpour

#endif  // DOWNPOUR_SERVER_INTERNAL_RANGE_STORE_H_
