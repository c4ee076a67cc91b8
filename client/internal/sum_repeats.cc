#include "client/internal/sum_repeats.h"

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "client/internal/first_seen.h"
#include "client/internal/row_ops.h"
#include "client/split_by_owner.h"

namespace downpour {
namespace {

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

  *keys_out = pool.Acquire(distinct * sizeof(Key));
  *values_out = pool.Acquire(distinct * width * sizeof(float));
  auto* out_keys = reinterpret_cast<Key*>(keys_out->data());
  auto* out = reinterpret_cast<float*>(values_out->data());
  const RowOp copy = RowCopyFor(width), add = RowAddFor(width);
  // A first occurrence's entry (first[p] == p) is not read as such after
  // the loop passes p, so it takes the key's place among the distinct
  // ones, which its repeats (first[i] == p) then read.
  uint32_t next = 0;
  for (size_t i = 0; i < n; ++i) {
    const float* row = values + i * width;
    if (first[i] == i) {
      first[i] = next;
      out_keys[next] = keys[i];
      copy(out + size_t{next} * width, row, width);
      ++next;
    } else {
      add(out + size_t{first[first[i]]} * width, row, width);
    }
  }
  return distinct;
}

}  // namespace downpour
