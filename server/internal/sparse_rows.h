// The rows of one sparse range: an index from 64-bit keys to rows kept in
// fixed-size chunks, and, for bounded tables (TableSpec.bounds), what keeps
// them within a cap: eviction (LRU or sampled LFU), expiry (a TTL in clocks
// or seconds), admission by frequency, and an optional cold tier.
//
//   SparseRows rows(&layout, begin, end, bounds, cold);  // cold may be null
//   SparseRows::Room room;
//   absl::Status s = rows.Prepare(keys, Write::kPush, pinned, &room);
//   ... forward room.gone (EVICT) and room.back's rows to the backups ...
//   for (Key k : keys) if (Row r = rows.Touch(k, Write::kPush)) apply(r);
//   rows.Read(key, out);                      // memory, cold or initial
//
// Decisions and their replication. Only the range's primary decides what
// leaves memory and what comes back: it alone calls Prepare and Expire. It
// forwards those keys in its replication stream before the write that
// needed the room: the keys that left (EVICT; a backup applies them with
// Evict) and the rows brought back from the cold tier, with their values
// (a backup imports them). A backup's own writes never evict (it never
// calls Prepare), so primary and backups hold the same rows in memory and
// in the cold tier.
// Admission counters change only with pushes, which every holder applies
// in the same order, so they agree too.
//
// What counts as use (LRU recency, LFU counts, TTL): reads and writes on
// the primary; a backup sees writes only, which matters only after it is
// promoted.
//
// Memory: a row costs its values and handler state plus about
// kSparseRowOverheadBytes: its key (8), recency links (8), a stamp and a
// use count (8), and its index slot (4 bytes at a load of 0.4 to 0.8).
// Rows, keys and metadata live in chunks of 1024 rows (growth never copies
// them); freed rows are reused. A row's values and its handler state lie
// side by side, so a push's row is one or two adjacent cache lines.
//
// Not thread-safe: the range's data thread uses it. The counters are
// atomics, readable from any thread.
#ifndef DOWNPOUR_SERVER_INTERNAL_SPARSE_ROWS_H_
#define DOWNPOUR_SERVER_INTERNAL_SPARSE_ROWS_H_

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <map>
#include <memory>
#include <optional>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "common/sparse_row_bytes.h"
#include "common/types.h"
#include "handlers/handler.h"
#include "handlers/initializer.h"
#include "proto/downpour.pb.h"
#include "storage/cold_store.h"

namespace downpour {
namespace server_internal {

// SparseBounds as one range applies them.
struct RangeBounds {
  uint64_t max_rows = 0;  // 0: no cap
  proto::SparseBounds::Eviction eviction = proto::SparseBounds::EVICTION_NONE;
  int64_t ttl_clocks = 0;
  absl::Duration ttl = absl::ZeroDuration();
  uint32_t admit_after = 1;
  uint64_t max_pending = 0;
  bool cold = false;

  // The bounds of table `spec` for its range of keys [begin, end): the
  // table's caps times the range's share of the key space (KeySpaceShare).
  static RangeBounds Of(const proto::TableSpec& spec, size_t width,
                        size_t state_width, Key begin, Key end);
};

class SparseRows {
 public:
  // What a write does to a row that is absent: a push counts towards its
  // admission; a put or an add creates it at once. kRead: a read, which
  // creates nothing but brings cold rows back (Prepare only).
  enum class Write { kPut, kAdd, kPush, kRead };
  struct Row {
    float* values = nullptr;
    float* state = nullptr;
    explicit operator bool() const { return values != nullptr; }
  };
  // What a write's preparation moved: keys that left memory (evicted or
  // expired, in that order), and keys brought back from the cold tier.
  struct Room {
    std::vector<Key> gone;
    std::vector<Key> back;
    void clear() {
      gone.clear();
      back.clear();
    }
  };

  // `init`, `handler` and `cold` (null without a cold tier) must outlive
  // the rows.
  SparseRows(const Initializer* init, const UpdateHandler* handler,
             size_t width, Key begin, Key end, RangeBounds bounds,
             std::unique_ptr<storage::ColdRange> cold);
  ~SparseRows();
  SparseRows(const SparseRows&) = delete;
  SparseRows& operator=(const SparseRows&) = delete;

  const RangeBounds& bounds() const { return bounds_; }
  bool bounded() const { return bounded_; }
  size_t width() const { return width_; }
  size_t state_width() const { return state_width_; }
  // Floats a row is copied as: values, then handler state.
  size_t RowFloats() const { return width_ + state_width_; }
  // The newest worker clock the range has seen (ttl_clocks); never moves
  // back.
  void ObserveClock(int64_t clock);
  // Reads the time for the stamps of the operations that follow (a stamp
  // is whole seconds: one reading serves a request).
  void StartRequest();

  // Makes room for the rows a write of `keys` creates in memory (absent
  // keys: each one for a put or an add, those reaching admission for a
  // push; and the cold ones, brought back) by evicting rows that neither
  // `keys` nor `pinned` (may be null: keys of held BSP steps) name, least
  // valuable first, after expiring a bounded number of idle rows. Records
  // what moved in `room`. kResourceExhausted, with nothing changed, when
  // the cap cannot be kept (no eviction policy, too many rows pinned, or
  // more new rows than the cap); kResourceExhausted or another storage
  // error if the cold tier fails (then some rows may have moved: they are
  // in `room`). An unbounded range: OK, nothing moves. The primary only.
  absl::Status Prepare(absl::Span<const Key> keys, Write write,
                       const absl::flat_hash_set<Key>* pinned, Room* room);
  // The row of `key` for a write, created from its initial values if
  // absent; for a push not yet admitted, counts it and returns no row (the
  // push is not stored). On the primary of a bounded range, REQUIRES that
  // Prepare covered the key (a backup's writes follow the primary's
  // decisions). Counts as use.
  Row Touch(Key key, Write write);
  // Touch over a batch, calling fn(i, row) for each key i that has (or
  // gets) a row. The same as Touch key by key, in order, but the lookups
  // of the next keys are overlapped (a lookup is two cache misses: the
  // index, then the row's slot; a batch of random ids is memory-bound).
  template <typename F>
  void TouchBatch(absl::Span<const Key> keys, Write write, F fn) {
    uint32_t slots[kBatchBlock];
    for (size_t b = 0; b < keys.size(); b += kBatchBlock) {
      const size_t n = std::min(kBatchBlock, keys.size() - b);
      LookupBatch(keys.subspan(b, n), RowFloats(), slots);
      for (size_t i = 0; i < n; ++i) {
        // A key repeated in the block, or absent when looked up: created by
        // the first Touch, found by the later ones.
        uint32_t s = slots[i];
        if (s == kNone || At(s).key != keys[b + i] || At(s).uses == 0) {
          const Row r = Touch(keys[b + i], write);
          if (r) fn(b + i, r);
          continue;
        }
        Use(s);
        fn(b + i, RowAt(s));
      }
    }
  }
  // Read over a batch (out: keys.size() rows), with overlapped lookups.
  absl::Status ReadBatch(absl::Span<const Key> keys, float* out);
  // The values of `key` into out[width]: from memory, else the cold tier,
  // else its initial values. Creates nothing. Counts as use. A cold tier
  // that fails is the error (out then holds the initial values).
  absl::Status Read(Key key, float* out);
  // The row of `key` if it is in memory; nothing else happens.
  Row Find(Key key) const;
  // Copies the rows of `keys` (each in memory) as a chunk: all values,
  // then all handler state.
  void CopyRows(absl::Span<const Key> keys, std::vector<float>* data) const;

  // Rows leaving memory by the primary's decision (a backup applying
  // EVICT): to the cold tier, or dropped. Keys not in memory are skipped.
  absl::Status Evict(absl::Span<const Key> keys);
  // The primary's expiry between writes: at most `max_rows` idle rows not
  // `pinned` leave memory; their keys are appended to `room->gone`.
  absl::Status Expire(size_t max_rows, const absl::flat_hash_set<Key>* pinned,
                      Room* room);

  // Copying the range (a backup catching up, a checkpoint), `cursor` 0
  // first, until nullopt: the rows in memory (in slot order), then the
  // admission counters, then, with `with_cold`, the cold tier's rows. A
  // walk sees every row present when it started and not moved since (what
  // changes later travels in the replication stream). `data`: as CopyRows
  // (ROWS, COLD; has_state when the handler keeps state), or one count per
  // key (PENDING).
  struct Chunk {
    proto::RowChunkInfo::Kind kind = proto::RowChunkInfo::ROWS;
    std::vector<Key> keys;
    std::vector<float> data;
  };
  std::optional<uint64_t> Export(uint64_t cursor, size_t max_bytes,
                                 bool with_cold, Chunk* out) const;
  // Overwrites rows (ROWS: in memory, creating them and leaving the cold
  // tier; COLD: in the cold tier) or sets admission counters (PENDING).
  // kDataLoss for a chunk of the wrong size or a key outside the range
  // (nothing changes), or a cold chunk without a cold tier.
  absl::Status Import(proto::RowChunkInfo::Kind kind,
                      absl::Span<const Key> keys, absl::Span<const float> data);

  // Figures.
  uint64_t rows() const { return live_.load(std::memory_order_relaxed); }
  uint64_t allocated_bytes() const {
    return allocated_.load(std::memory_order_relaxed);
  }
  uint64_t state_bytes() const {
    return state_bytes_.load(std::memory_order_relaxed);
  }
  uint64_t evicted() const { return evicted_.load(std::memory_order_relaxed); }
  uint64_t expired() const { return expired_.load(std::memory_order_relaxed); }
  uint64_t admitted() const {
    return admitted_.load(std::memory_order_relaxed);
  }
  uint64_t refused() const { return refused_.load(std::memory_order_relaxed); }
  uint64_t pending_ids() const {
    return pending_count_.load(std::memory_order_relaxed);
  }
  uint64_t cold_rows() const {
    return cold_count_.load(std::memory_order_relaxed);
  }
  // The admission count of `key` (0: none); for tests.
  uint32_t PendingCount(Key key) const;
  // Whether `key` is in the cold tier; for tests.
  bool IsCold(Key key) const {
    return cold_ != nullptr && cold_->Contains(key);
  }
  // The index drops its tags when a slot number reaches `slots` instead of
  // 2^24 - 1 (a test cannot make sixteen million rows); for tests.
  void UntagAtForTesting(uint32_t slots) {
    untag_at_ = std::min(slots, untag_at_);
  }

 private:
  static constexpr uint32_t kNone = 0xffffffffu;
  static constexpr size_t kChunkRows = 1024;
  // A row's key and metadata, 24 bytes, kept in chunks like its floats
  // (growth never copies, and no vector doubles its capacity).
  struct Slot {
    Key key = 0;
    uint32_t prev = kNone;  // towards more recent (free: unused)
    uint32_t next = kNone;  // towards less recent (free: the next free)
    uint32_t stamp = 0;     // last use: a clock, or seconds since creation
    uint32_t uses = 0;      // LFU: reads and writes, saturating; 0: free
  };
  struct Pending {
    uint32_t count = 0;
    uint64_t order = 0;  // key in pending_order_
  };

  uint32_t Stamp() const;
  bool Idle(const Slot& m) const;

  // The index: open addressing over slot numbers, linear probing,
  // backward-shift deletion. While the range has fewer than 2^24 - 1
  // slots, an entry's top byte holds 8 bits of its key's hash (a tag): a
  // probe passes over other keys' entries without reading their slots.
  uint32_t Lookup(Key key) const;  // kNone if absent
  uint32_t TagOf(uint64_t hash) const {
    return static_cast<uint32_t>(hash >> 32) & tag_mask_;
  }
  // Lookup of up to kBatchBlock keys into `slots`, with the index entries,
  // slots and rows (`row_floats` of each: the values for a read, values and
  // state for a write) of later keys prefetched while earlier ones are
  // resolved.
  static constexpr size_t kBatchBlock = 64;
  void LookupBatch(absl::Span<const Key> keys, size_t row_floats,
                   uint32_t* slots) const;
  void IndexInsert(Key key, uint32_t slot);
  void IndexErase(Key key);
  void Rehash(size_t capacity);

  Row RowAt(uint32_t slot) const;
  // A free or new slot for `key`, indexed and linked at the front, with
  // uninitialized floats.
  uint32_t NewSlot(Key key);
  void Unlink(uint32_t slot);
  void LinkFront(uint32_t slot);
  void Use(uint32_t slot);
  // Takes `slots` out of memory: to the cold tier (one write), or dropped.
  absl::Status Remove(absl::Span<const uint32_t> slots);
  // Unindexes and frees `slot` (its row is gone from memory).
  void FreeSlot(uint32_t slot);
  // Appends `count` eviction victims to `out`, rows named neither by
  // `keep` nor `pinned` (each victim is added to `keep`). False if there
  // are not enough.
  bool Victims(uint64_t count, absl::flat_hash_set<Key>* keep,
               const absl::flat_hash_set<Key>* pinned,
               std::vector<uint32_t>* out);
  // Brings cold `key` back into a new slot. False if it was not there.
  absl::StatusOr<bool> BringBack(Key key);
  // The same for `keys` (one read); those brought back are appended to
  // `back`.
  absl::Status BringBack(absl::Span<const Key> keys, std::vector<Key>* back);
  // Counts a push of absent `key`: true when it is admitted now.
  bool CountPush(Key key);
  void ForgetPending(Key key);
  void UpdateAccounting();

  const Initializer* const init_;
  const UpdateHandler* const handler_;
  const size_t width_, state_width_;
  const Key begin_, end_;
  const RangeBounds bounds_;
  const bool bounded_;
  const std::unique_ptr<storage::ColdRange> cold_;
  const absl::Time created_ = absl::Now();
  int64_t clock_ = 0;
  uint32_t now_seconds_ = 0;

  std::vector<uint32_t> index_;  // power-of-2 capacity; kNone: empty
  size_t index_used_ = 0;
  uint32_t tag_mask_ = 0xff000000u;  // 0 once slot numbers need 32 bits
  uint32_t slot_mask_ = 0x00ffffffu;
  uint32_t untag_at_ = 0x00ffffffu;  // the first slot number without room
  Slot& At(uint32_t slot) {
    return slot_chunks_[slot / kChunkRows][slot % kChunkRows];
  }
  const Slot& At(uint32_t slot) const {
    return slot_chunks_[slot / kChunkRows][slot % kChunkRows];
  }
  std::vector<std::unique_ptr<Slot[]>> slot_chunks_;
  uint32_t num_slots_ = 0;      // slots ever used
  uint32_t free_head_ = kNone;  // freed slots, linked through `next`
  // A row's values and its handler state side by side (one cache line at
  // width 8 with Adagrad's state: a push touches both), chunks aligned to
  // cache lines.
  struct FreeAligned {
    void operator()(float* p) const { std::free(p); }
  };
  std::vector<std::unique_ptr<float[], FreeAligned>> row_chunks_;
  uint32_t head_ = kNone, tail_ = kNone;  // most and least recent
  uint64_t rng_;                          // LFU sampling

  absl::flat_hash_map<Key, Pending> pending_;
  std::map<uint64_t, Key> pending_order_;  // least recently pushed first
  uint64_t next_pending_order_ = 1;

  std::vector<float> row_buf_;
  std::vector<float> cold_buf_;     // rows to or from the tier, reused
  std::vector<Key> cold_keys_buf_;  // their keys
  absl::flat_hash_set<Key> batch_;  // Prepare's keys, reused
  absl::flat_hash_map<Key, uint32_t> batch_pushes_;

  std::atomic<uint64_t> live_{0};
  std::atomic<uint64_t> allocated_{0};
  std::atomic<uint64_t> state_bytes_{0};
  std::atomic<uint64_t> evicted_{0};
  std::atomic<uint64_t> expired_{0};
  std::atomic<uint64_t> admitted_{0};
  std::atomic<uint64_t> refused_{0};
  std::atomic<uint64_t> pending_count_{0};
  std::atomic<uint64_t> cold_count_{0};
};

}  // namespace server_internal
}  // namespace downpour

#endif  // DOWNPOUR_SERVER_INTERNAL_SPARSE_ROWS_H_
