#include "client/internal/sum_repeats.h"

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "client/internal/first_seen.h"
#include "client/split_by_owner.h"

namespace downpour {
namespace {

// dst += src (kAdd) or dst = src, a row of kWidth floats (0: `width`).
// Fixed widths compile to a few vector moves instead of a loop with a count
// or a call to memcpy a row.
template <size_t kWidth, bool kAdd>
void RowOp(float* dst, const float* src, size_t width) {
  const size_t w = kWidth > 0 ? kWidth : width;
  for (size_t c = 0; c < w; ++c) {
    if constexpr (kAdd) {
      dst[c] += src[c];
    } else {
      dst[c] = src[c];
    }
  }
}
using RowFn = void (*)(float*, const float*, size_t);
template <bool kAdd>
RowFn RowFnFor(size_t width) {
  switch (width) {
    case 1:
      return &RowOp<1, kAdd>;
    case 4:
      return &RowOp<4, kAdd>;
    case 8:
      return &RowOp<8, kAdd>;
    case 16:
      return &RowOp<16, kAdd>;
    case 32:
      return &RowOp<32, kAdd>;
    case 64:
      return &RowOp<64, kAdd>;
    default:
      return &RowOp<0, kAdd>;
  }
}

// first[i] = the position of keys[i]'s first occurrence, for a batch too
// large for the thread's FirstSeen table: positions sorted by key (stable,
// so each key's run starts at its first occurrence).
void FirstBySorting(absl::Span<const Key> keys, uint32_t* first) {
  std::vector<uint32_t> order(keys.size());
  std::iota(order.begin(), order.end(), 0u);
  std::stable_sort(order.begin(), order.end(),
                   [&](uint32_t a, uint32_t b) { return keys[a] < keys[b]; });
  for (size_t i = 0; i < order.size();) {
    size_t j = i;
    while (j < order.size() && keys[order[j]] == keys[order[i]]) {
      first[order[j++]] = order[i];
    }
    i = j;
  }
}

}  // namespace

absl::StatusOr<size_t> SumRepeats(absl::Span<const Key> keys,
                                  const float* values, size_t width,
                                  BufferPool& pool, Buffer* keys_out,
                                  Buffer* values_out) {
  const size_t n = keys.size();
  if (n < 2) return n;
  if (n >= (size_t{1} << 32)) {
    return absl::InvalidArgumentError(absl::StrCat(
        n,
        " keys in one batch of a table that sums repeats: at most 2^32 - 1"));
  }
  Buffer first_buffer = pool.Acquire(n * sizeof(uint32_t));
  auto* first = reinterpret_cast<uint32_t*>(first_buffer.data());
  // FirstSeen records every key of a batch of at most half its entries;
  // past that it would miss repeats, which here change the result.
  if (n <= FirstSeen::kMaxEntries / 2) {
    FirstSeen::ForThisThread(n).InsertBatch(keys, Selection::Slice(0, n),
                                            first);
  } else {
    FirstBySorting(keys, first);
  }
  size_t distinct = 0;
  for (size_t i = 0; i < n; ++i) distinct += first[i] == i;
  if (distinct == n) return n;

  // slot[p]: where the distinct key first seen at position p went.
  Buffer slot_buffer = pool.Acquire(n * sizeof(uint32_t));
  auto* slot = reinterpret_cast<uint32_t*>(slot_buffer.data());
  *keys_out = pool.Acquire(distinct * sizeof(Key));
  *values_out = pool.Acquire(distinct * width * sizeof(float));
  auto* out_keys = reinterpret_cast<Key*>(keys_out->data());
  auto* out = reinterpret_cast<float*>(values_out->data());
  const RowFn copy = RowFnFor<false>(width), add = RowFnFor<true>(width);
  uint32_t next = 0;
  for (size_t i = 0; i < n; ++i) {
    const float* row = values + i * width;
    if (first[i] == i) {
      slot[i] = next;
      out_keys[next] = keys[i];
      copy(out + size_t{next} * width, row, width);
      ++next;
    } else {
      add(out + size_t{slot[first[i]]} * width, row, width);
    }
  }
  return distinct;
}

}  // namespace downpour
