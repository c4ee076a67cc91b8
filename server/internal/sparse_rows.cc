#include "server/internal/sparse_rows.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <new>

#include "absl/strings/str_cat.h"
#include "common/random.h"
#include "common/status_macros.h"

namespace downpour {
namespace server_internal {
namespace {

// Key mixing for the index: ids are often sequential or share low bits.
inline uint64_t Mix(uint64_t key) { return SplitMix64(key); }

// Export cursors: the phase in the top two bits, a position below.
constexpr uint64_t kPhaseShift = 62;
constexpr uint64_t kPositionMask = (uint64_t{1} << kPhaseShift) - 1;
enum Phase : uint64_t { kMemory = 0, kPendingPhase = 1, kColdPhase = 2 };
uint64_t Cursor(Phase p, uint64_t position) {
  return (static_cast<uint64_t>(p) << kPhaseShift) | position;
}

// Expired rows a write removes at least, when it removes any.
constexpr size_t kMinExpirePerWrite = 64;
// How far an LRU walk for a victim goes past rows it must keep.
constexpr size_t kMaxVictimWalk = 1 << 16;
constexpr int kLfuSample = 8;

}  // namespace

RangeBounds RangeBounds::Of(const proto::TableSpec& spec, size_t width,
                            size_t state_width, Key begin, Key end) {
  RangeBounds b;
  if (!spec.has_bounds()) return b;
  const proto::SparseBounds& s = spec.bounds();
  const uint64_t extent = end > begin ? end - begin : 0;
  b.max_rows =
      RangeRowCap(static_cast<uint64_t>(std::max<int64_t>(0, s.max_rows())),
                  static_cast<uint64_t>(std::max<int64_t>(0, s.max_bytes())),
                  width, state_width, extent, kKeySpaceEnd);
  b.eviction = s.eviction();
  b.ttl_clocks = std::max<int64_t>(0, s.ttl_clocks());
  b.ttl = absl::Seconds(std::max<int64_t>(0, s.ttl_seconds()));
  b.admit_after =
      static_cast<uint32_t>(std::clamp<int64_t>(s.admit_after(), 1, 1 << 30));
  if (s.max_pending_ids() > 0) {
    b.max_pending = KeySpaceShare(static_cast<uint64_t>(s.max_pending_ids()),
                                  extent, kKeySpaceEnd);
  } else {
    b.max_pending = b.max_rows > 0 ? b.max_rows : uint64_t{1} << 20;
  }
  b.cold = s.cold_tier();
  return b;
}

SparseRows::SparseRows(const Initializer* init, const UpdateHandler* handler,
                       size_t width, Key begin, Key end, RangeBounds bounds,
                       std::unique_ptr<storage::ColdRange> cold)
    : init_(init),
      handler_(handler),
      width_(width),
      state_width_(handler->StateWidth(width)),
      begin_(begin),
      end_(end),
      bounds_(bounds),
      bounded_(bounds.max_rows > 0 || bounds.ttl_clocks > 0 ||
               bounds.ttl > absl::ZeroDuration() || bounds.admit_after > 1),
      cold_(std::move(cold)),
      rng_(SplitMix64(begin ^ 0x5eed)) {
  row_buf_.resize(RowFloats());
  UpdateAccounting();
}

SparseRows::~SparseRows() = default;

void SparseRows::ObserveClock(int64_t clock) {
  clock_ = std::max(clock_, clock);
}

void SparseRows::StartRequest() {
  now_seconds_ = static_cast<uint32_t>(
      std::max<int64_t>(0, absl::ToInt64Seconds(absl::Now() - created_)));
}

uint32_t SparseRows::Stamp() const {
  return bounds_.ttl_clocks > 0
             ? static_cast<uint32_t>(std::max<int64_t>(0, clock_))
             : now_seconds_;
}

bool SparseRows::Idle(const Slot& m) const {
  if (bounds_.ttl_clocks > 0) {
    return clock_ - static_cast<int64_t>(m.stamp) >= bounds_.ttl_clocks;
  }
  if (bounds_.ttl > absl::ZeroDuration()) {
    return static_cast<int64_t>(now_seconds_) - m.stamp >=
           absl::ToInt64Seconds(bounds_.ttl);
  }
  return false;
}

// --- The index ---------------------------------------------------------

uint32_t SparseRows::Lookup(Key key) const {
  if (index_.empty()) return kNone;
  const size_t mask = index_.size() - 1;
  const uint64_t hash = Mix(key);
  const uint32_t tag = TagOf(hash);
  for (size_t h = hash & mask;; h = (h + 1) & mask) {
    const uint32_t e = index_[h];
    if (e == kNone) return kNone;
    if ((e & tag_mask_) == tag && At(e & slot_mask_).key == key) {
      return e & slot_mask_;
    }
  }
}

void SparseRows::LookupBatch(absl::Span<const Key> keys, size_t row_floats,
                             uint32_t* slots) const {
  const size_t n = keys.size();
  if (index_.empty()) {
    std::fill_n(slots, n, kNone);
    return;
  }
  // Three stages, kAhead keys apart: hash and prefetch the index entry;
  // find the chain's entry whose tag matches and prefetch its slot and row
  // together (a row's place follows from its slot number alone); check the
  // slot's key. A lookup then waits for two misses in turn, not three, and
  // each overlaps the other keys' instead of following them.
  constexpr size_t kAhead = 8;
  constexpr size_t kMaxRowPrefetch = 1024;  // bytes
  const size_t mask = index_.size() - 1;
  size_t home[kBatchBlock];
  uint32_t tag[kBatchBlock];
  uint32_t candidate[kBatchBlock];
  for (size_t i = 0; i < n + 2 * kAhead; ++i) {
    if (i < n) {
      const uint64_t hash = Mix(keys[i]);
      home[i] = hash & mask;
      tag[i] = TagOf(hash);
      __builtin_prefetch(&index_[home[i]]);
    }
    if (i >= kAhead && i - kAhead < n) {
      // Other keys' entries in the chain are passed over by their tags
      // without reading their slots (one in 256 matches by chance; the
      // check below catches it).
      const size_t j = i - kAhead;
      uint32_t s = kNone;
      for (size_t h = home[j];; h = (h + 1) & mask) {
        const uint32_t e = index_[h];
        if (e == kNone) break;
        if ((e & tag_mask_) == tag[j]) {
          s = e & slot_mask_;
          break;
        }
      }
      candidate[j] = s;
      if (s != kNone) {
        __builtin_prefetch(&At(s));
        // Every line of the row (values and state are side by side): a
        // wide row's later lines would otherwise be misses of their own.
        const uintptr_t row = reinterpret_cast<uintptr_t>(RowAt(s).values);
        const uintptr_t end =
            row + std::min(row_floats * sizeof(float), kMaxRowPrefetch);
        for (uintptr_t line = row & ~uintptr_t{63}; line < end; line += 64) {
          __builtin_prefetch(reinterpret_cast<const void*>(line), 1);
        }
      }
    }
    if (i >= 2 * kAhead && i - 2 * kAhead < n) {
      const size_t j = i - 2 * kAhead;
      const uint32_t s = candidate[j];
      // No entry with the key's tag: absent. A tag matched by another key:
      // the whole chain, key by key.
      slots[j] = s == kNone || At(s).key == keys[j] ? s : Lookup(keys[j]);
    }
  }
}

absl::Status SparseRows::ReadBatch(absl::Span<const Key> keys, float* out) {
  uint32_t slots[kBatchBlock];
  absl::Status status;
  std::vector<Key> cold;
  std::vector<size_t> cold_at;
  for (size_t b = 0; b < keys.size(); b += kBatchBlock) {
    const size_t n = std::min(kBatchBlock, keys.size() - b);
    LookupBatch(keys.subspan(b, n), width_, slots);
    for (size_t i = 0; i < n; ++i) {
      float* dst = out + (b + i) * width_;
      if (slots[i] != kNone) {
        Use(slots[i]);
        std::memcpy(dst, RowAt(slots[i]).values, width_ * sizeof(float));
      } else if (cold_ != nullptr && cold_->Contains(keys[b + i])) {
        cold.push_back(keys[b + i]);
        cold_at.push_back(b + i);
      } else {
        init_->FillRow(keys[b + i], width_, dst);
      }
    }
  }
  if (cold.empty()) return status;
  // The batch's cold rows in one read of the tier.
  const size_t rf = RowFloats();
  cold_buf_.resize(cold.size() * rf);
  std::vector<bool> found;
  status = cold_->GetBatch(cold, absl::MakeSpan(cold_buf_), &found);
  for (size_t i = 0; i < cold.size(); ++i) {
    float* dst = out + cold_at[i] * width_;
    if (status.ok() && found[i]) {
      std::memcpy(dst, cold_buf_.data() + i * rf, width_ * sizeof(float));
    } else {
      init_->FillRow(cold[i], width_, dst);
    }
  }
  return status;
}

void SparseRows::Rehash(size_t capacity) {
  index_.assign(capacity, kNone);
  const size_t mask = capacity - 1;
  for (uint32_t s = 0; s < num_slots_; ++s) {
    if (At(s).uses == 0) continue;
    const uint64_t hash = Mix(At(s).key);
    size_t h = hash & mask;
    while (index_[h] != kNone) h = (h + 1) & mask;
    index_[h] = s | TagOf(hash);
  }
}

void SparseRows::IndexInsert(Key key, uint32_t slot) {
  // Load at most 0.8: short probes, 4 to 8 bytes of index per row.
  if ((index_used_ + 1) * 5 > index_.size() * 4) {
    Rehash(std::max<size_t>(16, index_.size() * 2));
    UpdateAccounting();
  }
  const size_t mask = index_.size() - 1;
  const uint64_t hash = Mix(key);
  size_t h = hash & mask;
  while (index_[h] != kNone) h = (h + 1) & mask;
  index_[h] = slot | TagOf(hash);
  ++index_used_;
}

void SparseRows::IndexErase(Key key) {
  const size_t mask = index_.size() - 1;
  size_t i = Mix(key) & mask;
  while (index_[i] != kNone && At(index_[i] & slot_mask_).key != key) {
    i = (i + 1) & mask;
  }
  if (index_[i] == kNone) return;
  // Backward-shift deletion: later entries of the probe chain move up, so
  // that no lookup stops early at the hole (no tombstones).
  for (size_t j = (i + 1) & mask; index_[j] != kNone; j = (j + 1) & mask) {
    const size_t home = Mix(At(index_[j] & slot_mask_).key) & mask;
    const bool stays =
        (i <= j) ? (i < home && home <= j) : (i < home || home <= j);
    if (stays) continue;
    index_[i] = index_[j];
    i = j;
  }
  index_[i] = kNone;
  --index_used_;
}

// --- Rows and recency --------------------------------------------------

SparseRows::Row SparseRows::RowAt(uint32_t slot) const {
  float* row = row_chunks_[slot / kChunkRows].get() +
               (slot % kChunkRows) * (width_ + state_width_);
  return {row, state_width_ ? row + width_ : nullptr};
}

SparseRows::Row SparseRows::Find(Key key) const {
  const uint32_t s = Lookup(key);
  return s == kNone ? Row{} : RowAt(s);
}

void SparseRows::Unlink(uint32_t slot) {
  Slot& m = At(slot);
  if (m.prev != kNone) {
    At(m.prev).next = m.next;
  } else {
    head_ = m.next;
  }
  if (m.next != kNone) {
    At(m.next).prev = m.prev;
  } else {
    tail_ = m.prev;
  }
  m.prev = m.next = kNone;
}

void SparseRows::LinkFront(uint32_t slot) {
  Slot& m = At(slot);
  m.prev = kNone;
  m.next = head_;
  if (head_ != kNone) At(head_).prev = slot;
  head_ = slot;
  if (tail_ == kNone) tail_ = slot;
}

void SparseRows::Use(uint32_t slot) {
  if (!bounded_) return;
  Slot& m = At(slot);
  if (m.uses != std::numeric_limits<uint32_t>::max()) ++m.uses;
  m.stamp = Stamp();
  if (head_ != slot) {
    Unlink(slot);
    LinkFront(slot);
  }
}

uint32_t SparseRows::NewSlot(Key key) {
  uint32_t slot;
  if (free_head_ != kNone) {
    slot = free_head_;
    free_head_ = At(slot).next;
  } else {
    slot = num_slots_++;
    if (slot / kChunkRows == row_chunks_.size()) {
      constexpr size_t kLine = 64;
      const size_t bytes = kChunkRows * RowFloats() * sizeof(float);
      auto* chunk = static_cast<float*>(
          std::aligned_alloc(kLine, (bytes + kLine - 1) / kLine * kLine));
      if (chunk == nullptr) throw std::bad_alloc();
      row_chunks_.emplace_back(chunk);
      slot_chunks_.emplace_back(new Slot[kChunkRows]);
      UpdateAccounting();
    }
  }
  Slot& m = At(slot);
  m = Slot();
  if (tag_mask_ != 0 && slot >= untag_at_) {
    // Slot numbers need the entries' top byte now: the index goes on
    // without tags (the new slot is not in use yet, so not indexed twice).
    tag_mask_ = 0;
    slot_mask_ = kNone;
    if (!index_.empty()) Rehash(index_.size());
  }
  m.key = key;
  m.stamp = Stamp();
  // Indexed before it counts as used (uses > 0): a rehash on the way must
  // not index it a second time.
  IndexInsert(key, slot);
  m.uses = 1;
  LinkFront(slot);
  live_.fetch_add(1, std::memory_order_relaxed);
  return slot;
}

absl::Status SparseRows::Remove(absl::Span<const uint32_t> slots) {
  if (slots.empty()) return absl::OkStatus();
  if (cold_ != nullptr) {
    // One write for all of them: a RocksDB write per row costs more than
    // the rest of the eviction together.
    const size_t rf = RowFloats();
    cold_buf_.resize(slots.size() * rf);
    cold_keys_buf_.resize(slots.size());
    for (size_t i = 0; i < slots.size(); ++i) {
      const Row r = RowAt(slots[i]);
      cold_keys_buf_[i] = At(slots[i]).key;
      std::memcpy(cold_buf_.data() + i * rf, r.values, width_ * sizeof(float));
      if (state_width_) {
        std::memcpy(cold_buf_.data() + i * rf + width_, r.state,
                    state_width_ * sizeof(float));
      }
    }
    absl::Status s = cold_->PutBatch(cold_keys_buf_, cold_buf_);
    if (!s.ok()) {
      // The rows stay in memory: records written before the error are not
      // current (the keys were in memory, so none was current before).
      for (Key k : cold_keys_buf_) cold_->Forget(k);
      return absl::Status(
          s.code(), absl::StrCat("cannot move ", slots.size(),
                                 " rows to the cold tier: ", s.message()));
    }
    cold_count_.store(cold_->size(), std::memory_order_relaxed);
  }
  for (uint32_t s : slots) FreeSlot(s);
  return absl::OkStatus();
}

void SparseRows::FreeSlot(uint32_t slot) {
  Slot& m = At(slot);
  Unlink(slot);
  IndexErase(m.key);
  m.uses = 0;
  m.next = free_head_;
  free_head_ = slot;
  live_.fetch_sub(1, std::memory_order_relaxed);
}

absl::StatusOr<bool> SparseRows::BringBack(Key key) {
  std::vector<Key> back;
  DP_RETURN_IF_ERROR(BringBack(absl::MakeConstSpan(&key, 1), &back));
  return !back.empty();
}

absl::Status SparseRows::BringBack(absl::Span<const Key> keys,
                                   std::vector<Key>* back) {
  if (cold_ == nullptr || keys.empty()) return absl::OkStatus();
  const size_t rf = RowFloats();
  cold_buf_.resize(keys.size() * rf);
  std::vector<bool> found;
  DP_RETURN_IF_ERROR(cold_->GetBatch(keys, absl::MakeSpan(cold_buf_), &found));
  for (size_t i = 0; i < keys.size(); ++i) {
    // Its record stays, no longer current (reads and walks skip it); the
    // key's next eviction overwrites it.
    cold_->Forget(keys[i]);
    if (!found[i]) continue;
    const uint32_t slot = NewSlot(keys[i]);
    const Row r = RowAt(slot);
    std::memcpy(r.values, cold_buf_.data() + i * rf, width_ * sizeof(float));
    if (state_width_) {
      std::memcpy(r.state, cold_buf_.data() + i * rf + width_,
                  state_width_ * sizeof(float));
    }
    back->push_back(keys[i]);
  }
  cold_count_.store(cold_->size(), std::memory_order_relaxed);
  return absl::OkStatus();
}

bool SparseRows::Victims(uint64_t count, absl::flat_hash_set<Key>* keep,
                         const absl::flat_hash_set<Key>* pinned,
                         std::vector<uint32_t>* out) {
  auto eligible = [&](uint32_t s) {
    return (At(s).uses != 0) && !keep->contains(At(s).key) &&
           (pinned == nullptr || !pinned->contains(At(s).key));
  };
  auto take = [&](uint32_t s) {
    out->push_back(s);
    keep->insert(At(s).key);
    --count;
  };
  if (bounds_.eviction == proto::SparseBounds::LFU) {
    // Sampled LFU (as Redis does): the least used of a few random rows,
    // the least recently used on a tie. O(1) per victim, no ordered
    // structure to keep.
    while (count > 0) {
      uint32_t best = kNone;
      int seen = 0;
      for (int tries = 0; tries < 16 * kLfuSample && seen < kLfuSample;
           ++tries) {
        rng_ = SplitMix64(rng_);
        const uint32_t s = static_cast<uint32_t>(rng_ % num_slots_);
        if (!eligible(s)) continue;
        ++seen;
        if (best == kNone || At(s).uses < At(best).uses ||
            (At(s).uses == At(best).uses && At(s).stamp < At(best).stamp)) {
          best = s;
        }
      }
      if (best == kNone) break;  // mostly kept rows: walk instead
      take(best);
    }
  }
  // LRU (and what LFU's sampling did not find): one walk from the least
  // recently used row.
  const size_t limit = keep->size() + (pinned == nullptr ? 0 : pinned->size()) +
                       count + kMaxVictimWalk;
  size_t walked = 0;
  for (uint32_t s = tail_; s != kNone && count > 0 && walked < limit;
       s = At(s).prev, ++walked) {
    if (eligible(s)) take(s);
  }
  return count == 0;
}

// --- Admission -----------------------------------------------------------

bool SparseRows::CountPush(Key key) {
  auto [it, inserted] = pending_.try_emplace(key);
  Pending& p = it->second;
  if (inserted) {
    pending_count_.fetch_add(1, std::memory_order_relaxed);
  } else {
    pending_order_.erase(p.order);
  }
  ++p.count;
  if (p.count >= bounds_.admit_after) {
    pending_.erase(it);
    pending_count_.fetch_sub(1, std::memory_order_relaxed);
    return true;
  }
  p.order = next_pending_order_++;
  pending_order_.emplace(p.order, key);
  // Bounded: the id pushed least recently is forgotten (deterministic: the
  // same pushes in the same order forget the same ids on every holder).
  while (pending_.size() > bounds_.max_pending) {
    auto oldest = pending_order_.begin();
    pending_.erase(oldest->second);
    pending_order_.erase(oldest);
    pending_count_.fetch_sub(1, std::memory_order_relaxed);
  }
  return false;
}

void SparseRows::ForgetPending(Key key) {
  auto it = pending_.find(key);
  if (it == pending_.end()) return;
  pending_order_.erase(it->second.order);
  pending_.erase(it);
  pending_count_.fetch_sub(1, std::memory_order_relaxed);
}

uint32_t SparseRows::PendingCount(Key key) const {
  auto it = pending_.find(key);
  return it == pending_.end() ? 0 : it->second.count;
}

// --- Writes --------------------------------------------------------------

absl::Status SparseRows::Prepare(absl::Span<const Key> keys, Write write,
                                 const absl::flat_hash_set<Key>* pinned,
                                 Room* room) {
  if (!bounded_) return absl::OkStatus();
  StartRequest();
  // What the write needs: rows to create (admission decides for pushes)
  // and cold rows to bring back.
  batch_.clear();
  batch_pushes_.clear();
  std::vector<Key> back;
  uint64_t creates = 0;
  const bool counted = write == Write::kPush && bounds_.admit_after > 1;
  for (Key k : keys) {
    if (!batch_.insert(k).second) {
      if (counted) {
        auto it = batch_pushes_.find(k);
        if (it != batch_pushes_.end()) ++it->second;
      }
      continue;
    }
    if (Lookup(k) != kNone) continue;
    if (cold_ != nullptr && cold_->Contains(k)) {
      back.push_back(k);
    } else if (counted) {
      batch_pushes_[k] = 1;
    } else if (write != Write::kRead) {
      ++creates;
    }
  }
  for (const auto& [k, n] : batch_pushes_) {
    if (PendingCount(k) + n >= bounds_.admit_after) ++creates;
  }
  const uint64_t needed = creates + back.size();
  auto refuse = [&](absl::string_view why) {
    refused_.fetch_add(1, std::memory_order_relaxed);
    return absl::ResourceExhaustedError(absl::StrCat(
        "keys [", begin_, ", ", end_, ") hold ", live_.load(), " of at most ",
        bounds_.max_rows, " rows; the write needs ", needed, " more: ", why));
  };
  // Idle rows go first (they may make eviction unnecessary), then, if the
  // cap needs it, the policy's victims; nothing moves unless all can.
  std::vector<uint32_t> expired, evicted;
  absl::flat_hash_set<Key> chosen;
  const size_t expire_limit = std::max<size_t>(kMinExpirePerWrite, 2 * needed);
  if (bounds_.ttl_clocks > 0 || bounds_.ttl > absl::ZeroDuration()) {
    size_t walked = 0;
    for (uint32_t s = tail_;
         s != kNone && expired.size() < expire_limit && walked < kMaxVictimWalk;
         s = At(s).prev, ++walked) {
      if (!Idle(At(s))) break;  // the list is ordered by last use
      if (batch_.contains(At(s).key) ||
          (pinned != nullptr && pinned->contains(At(s).key))) {
        continue;
      }
      expired.push_back(s);
      chosen.insert(At(s).key);
    }
  }
  if (bounds_.max_rows > 0) {
    if (needed > bounds_.max_rows) {
      return refuse("more new rows than the range's cap");
    }
    const uint64_t after = live_.load() - expired.size() + needed;
    if (after > bounds_.max_rows) {
      uint64_t excess = after - bounds_.max_rows;
      if (bounds_.eviction == proto::SparseBounds::EVICTION_NONE) {
        return refuse("the table evicts nothing (SparseBounds.eviction)");
      }
      // The write's own keys and the rows chosen so far stay.
      for (Key k : chosen) batch_.insert(k);
      if (!Victims(excess, &batch_, pinned, &evicted)) {
        return refuse(
            "too many of the other rows are pinned by held BSP "
            "steps");
      }
    }
  }
  std::vector<Key> gone;
  for (uint32_t s : expired) gone.push_back(At(s).key);
  for (uint32_t s : evicted) gone.push_back(At(s).key);
  expired.insert(expired.end(), evicted.begin(), evicted.end());
  DP_RETURN_IF_ERROR(Remove(expired));
  room->gone.insert(room->gone.end(), gone.begin(), gone.end());
  expired_.fetch_add(expired.size() - evicted.size(),
                     std::memory_order_relaxed);
  evicted_.fetch_add(evicted.size(), std::memory_order_relaxed);
  DP_RETURN_IF_ERROR(BringBack(back, &room->back));
  UpdateAccounting();
  return absl::OkStatus();
}

SparseRows::Row SparseRows::Touch(Key key, Write write) {
  uint32_t slot = Lookup(key);
  if (slot != kNone) {
    Use(slot);
    return RowAt(slot);
  }
  if (cold_ != nullptr && cold_->Contains(key)) {
    // Not prepared (a backup whose primary did not bring it back first:
    // not expected); bring it back rather than start it over.
    absl::StatusOr<bool> b = BringBack(key);
    if (b.ok() && *b) return RowAt(Lookup(key));
  }
  if (write == Write::kPush && bounds_.admit_after > 1 && !CountPush(key)) {
    return {};  // counted, not stored
  }
  ForgetPending(key);  // a put or an add admits it at once
  slot = NewSlot(key);
  const Row r = RowAt(slot);
  init_->FillRow(key, width_, r.values);
  if (r.state != nullptr) handler_->InitState(r.state, 1, width_);
  if (bounded_) admitted_.fetch_add(1, std::memory_order_relaxed);
  return r;
}

absl::Status SparseRows::Read(Key key, float* out) {
  const uint32_t slot = Lookup(key);
  if (slot != kNone) {
    Use(slot);
    std::memcpy(out, RowAt(slot).values, width_ * sizeof(float));
    return absl::OkStatus();
  }
  if (cold_ != nullptr && cold_->Contains(key)) {
    absl::StatusOr<bool> found = cold_->Get(key, absl::MakeSpan(row_buf_));
    if (found.ok() && *found) {
      std::memcpy(out, row_buf_.data(), width_ * sizeof(float));
      return absl::OkStatus();
    }
    init_->FillRow(key, width_, out);
    return found.ok() ? absl::OkStatus() : found.status();
  }
  init_->FillRow(key, width_, out);
  return absl::OkStatus();
}

void SparseRows::CopyRows(absl::Span<const Key> keys,
                          std::vector<float>* data) const {
  const size_t n = keys.size();
  data->resize(n * RowFloats());
  float* values = data->data();
  float* state = values + n * width_;
  for (size_t i = 0; i < n; ++i) {
    const Row r = Find(keys[i]);
    std::memcpy(values + i * width_, r.values, width_ * sizeof(float));
    if (state_width_) {
      std::memcpy(state + i * state_width_, r.state,
                  state_width_ * sizeof(float));
    }
  }
}

absl::Status SparseRows::Evict(absl::Span<const Key> keys) {
  std::vector<uint32_t> slots;
  for (Key k : keys) {
    const uint32_t s = Lookup(k);
    if (s != kNone) slots.push_back(s);
  }
  DP_RETURN_IF_ERROR(Remove(slots));
  evicted_.fetch_add(slots.size(), std::memory_order_relaxed);
  UpdateAccounting();
  return absl::OkStatus();
}

absl::Status SparseRows::Expire(size_t max_rows,
                                const absl::flat_hash_set<Key>* pinned,
                                Room* room) {
  if (bounds_.ttl_clocks <= 0 && bounds_.ttl <= absl::ZeroDuration()) {
    return absl::OkStatus();
  }
  StartRequest();
  size_t walked = 0, done = 0;
  std::vector<uint32_t> victims;
  uint32_t s = tail_;
  while (s != kNone && done < max_rows && walked < kMaxVictimWalk) {
    const uint32_t prev = At(s).prev;
    if (!Idle(At(s))) break;
    ++walked;
    if (pinned == nullptr || !pinned->contains(At(s).key)) {
      victims.push_back(s);
      ++done;
    }
    s = prev;
  }
  for (uint32_t v : victims) room->gone.push_back(At(v).key);
  DP_RETURN_IF_ERROR(Remove(victims));
  expired_.fetch_add(victims.size(), std::memory_order_relaxed);
  if (done > 0) UpdateAccounting();
  return absl::OkStatus();
}

// --- Copies ----------------------------------------------------------------

std::optional<uint64_t> SparseRows::Export(uint64_t cursor, size_t max_bytes,
                                           bool with_cold, Chunk* out) const {
  out->keys.clear();
  out->data.clear();
  const Phase phase = static_cast<Phase>(cursor >> kPhaseShift);
  const uint64_t pos = cursor & kPositionMask;
  auto after_memory = [&]() -> std::optional<uint64_t> {
    if (!pending_.empty()) return Cursor(kPendingPhase, 0);
    if (with_cold && cold_ != nullptr && cold_->size() > 0) {
      return Cursor(kColdPhase, 0);
    }
    return std::nullopt;
  };
  const size_t row_bytes = RowFloats() * sizeof(float) + sizeof(Key);
  const size_t max_rows = std::max<size_t>(1, max_bytes / row_bytes);
  if (phase == kMemory) {
    out->kind = proto::RowChunkInfo::ROWS;
    uint64_t s = pos;
    for (; s < num_slots_ && out->keys.size() < max_rows; ++s) {
      if ((At(s).uses != 0)) out->keys.push_back(At(s).key);
    }
    CopyRows(out->keys, &out->data);
    if (s < num_slots_) return Cursor(kMemory, s);
    return after_memory();
  }
  if (phase == kPendingPhase) {
    out->kind = proto::RowChunkInfo::PENDING;
    const size_t max_ids = std::max<size_t>(1, max_bytes / 12);
    auto it = pending_order_.lower_bound(pos);
    for (; it != pending_order_.end() && out->keys.size() < max_ids; ++it) {
      out->keys.push_back(it->second);
      // Counts are below 2^24 (admit_after is checked): exact as floats.
      out->data.push_back(
          static_cast<float>(pending_.find(it->second)->second.count));
    }
    if (it != pending_order_.end()) return Cursor(kPendingPhase, it->first);
    if (with_cold && cold_ != nullptr && cold_->size() > 0) {
      return Cursor(kColdPhase, 0);
    }
    return std::nullopt;
  }
  out->kind = proto::RowChunkInfo::COLD;
  std::vector<float> rows;
  absl::StatusOr<std::optional<uint64_t>> next =
      cold_->Scan(pos, max_rows, &out->keys, &rows);
  if (!next.ok()) {
    // A chunk that cannot be read ends the copy short; the receiver's
    // count then disagrees and the copy is retried by its owner.
    out->keys.clear();
    return std::nullopt;
  }
  // Rows come as values and state each; a chunk holds all values, then all
  // state.
  const size_t n = out->keys.size();
  out->data.resize(n * RowFloats());
  for (size_t i = 0; i < n; ++i) {
    std::memcpy(out->data.data() + i * width_, rows.data() + i * RowFloats(),
                width_ * sizeof(float));
    if (state_width_) {
      std::memcpy(out->data.data() + n * width_ + i * state_width_,
                  rows.data() + i * RowFloats() + width_,
                  state_width_ * sizeof(float));
    }
  }
  if (next->has_value()) return Cursor(kColdPhase, **next);
  return std::nullopt;
}

absl::Status SparseRows::Import(proto::RowChunkInfo::Kind kind,
                                absl::Span<const Key> keys,
                                absl::Span<const float> data) {
  const size_t n = keys.size();
  auto bad = [&](absl::string_view why) {
    return absl::DataLossError(absl::StrCat("keys [", begin_, ", ", end_,
                                            "): malformed row chunk: ", why));
  };
  for (Key k : keys) {
    if (k < begin_ || k >= end_) return bad(absl::StrCat("key ", k));
  }
  if (kind == proto::RowChunkInfo::PENDING) {
    if (data.size() != n) return bad("a count per key");
    for (size_t i = 0; i < n; ++i) {
      const float c = data[i];
      if (!(c >= 1 && c < 16777216.0f)) return bad("a count out of range");
    }
    for (size_t i = 0; i < n; ++i) {
      ForgetPending(keys[i]);
      Pending p;
      p.count = static_cast<uint32_t>(data[i]);
      p.order = next_pending_order_++;
      pending_order_.emplace(p.order, keys[i]);
      pending_.emplace(keys[i], p);
      pending_count_.fetch_add(1, std::memory_order_relaxed);
    }
    UpdateAccounting();
    return absl::OkStatus();
  }
  if (data.size() != n * RowFloats()) {
    return bad(absl::StrCat(data.size(), " floats for ", n, " rows"));
  }
  const float* values = data.data();
  const float* state = values + n * width_;
  if (kind == proto::RowChunkInfo::COLD) {
    if (cold_ == nullptr) return bad("cold rows for a range without a tier");
    cold_keys_buf_.clear();
    cold_buf_.clear();
    for (size_t i = 0; i < n; ++i) {
      // A row in memory here is newer than a cold copy (a checkpoint's copy
      // of the tier holds stale rows of keys that were in memory).
      if (Lookup(keys[i]) != kNone) continue;
      cold_keys_buf_.push_back(keys[i]);
      cold_buf_.insert(cold_buf_.end(), values + i * width_,
                       values + (i + 1) * width_);
      cold_buf_.insert(cold_buf_.end(), state + i * state_width_,
                       state + (i + 1) * state_width_);
    }
    DP_RETURN_IF_ERROR(cold_->PutBatch(cold_keys_buf_, cold_buf_));
    cold_count_.store(cold_->size(), std::memory_order_relaxed);
    UpdateAccounting();
    return absl::OkStatus();
  }
  for (size_t i = 0; i < n; ++i) {
    uint32_t s = Lookup(keys[i]);
    if (s == kNone) {
      // In memory now: the tier's copy, if any, is stale (see BringBack).
      if (cold_ != nullptr && cold_->Forget(keys[i])) {
        cold_count_.store(cold_->size(), std::memory_order_relaxed);
      }
      ForgetPending(keys[i]);
      s = NewSlot(keys[i]);
    }
    const Row r = RowAt(s);
    std::memcpy(r.values, values + i * width_, width_ * sizeof(float));
    if (state_width_) {
      std::memcpy(r.state, state + i * state_width_,
                  state_width_ * sizeof(float));
    }
  }
  UpdateAccounting();
  return absl::OkStatus();
}

// --- Accounting --------------------------------------------------------------

void SparseRows::UpdateAccounting() {
  const uint64_t values =
      row_chunks_.size() * kChunkRows * width_ * sizeof(float);
  const uint64_t state =
      row_chunks_.size() * kChunkRows * state_width_ * sizeof(float);
  const uint64_t index = index_.capacity() * sizeof(uint32_t) +
                         slot_chunks_.size() * kChunkRows * sizeof(Slot);
  // Admission counters: a hash slot (key, count, order) and an ordered-map
  // node each; the cold tier's index.
  const uint64_t admission =
      pending_.capacity() * (sizeof(Key) + 17) + pending_order_.size() * 48;
  const uint64_t cold = cold_ == nullptr ? 0 : cold_->index_bytes();
  state_bytes_.store(state, std::memory_order_relaxed);
  allocated_.store(values + state + index + admission + cold,
                   std::memory_order_relaxed);
}

}  // namespace server_internal
}  // namespace downpour
