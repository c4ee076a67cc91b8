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

// One pass for a batch that the thread's FirstSeen table holds: each
// key's first occurrence copies its row to the next place among the
// distinct ones, and each repeat adds to its key's place, while that key's
// table entry is in the cache (the rows of `width`, kWidth if not 0, are
// copied and added in line, not through a call a row: WithFixedWidth). Written
// in full before it is known whether the batch repeats any key: a batch that
// does not is rare in a table declared to sum repeats.
template <size_t kWidth>
size_t SumInOnePass(absl::Span<const Key> keys, const float* values,
                    size_t width, BufferPool& pool, Buffer* keys_out,
                    Buffer* values_out) {
  using row_ops_internal::Add;
  using row_ops_internal::Copy;
  const size_t n = keys.size();
  Buffer out_keys_buffer = pool.Acquire(n * sizeof(Key));
  Buffer out_buffer = pool.Acquire(n * width * sizeof(float));
  auto* out_keys = reinterpret_cast<Key*>(out_keys_buffer.data());
  auto* out = reinterpret_cast<float*>(out_buffer.data());
  const size_t distinct = FirstSeen::ForThisThread(n).NumberBatch(
      keys,
      [&](size_t i, size_t d) {
        out_keys[d] = keys[i];
        Copy::Apply<kWidth>(out + d * width, values + i * width, width);
      },
      [&](size_t i, size_t d) {
        Add::Apply<kWidth>(out + d * width, values + i * width, width);
      });
  if (distinct < n) {
    *keys_out = std::move(out_keys_buffer);
    *values_out = std::move(out_buffer);
  }
  return distinct;
}

// A batch too large for the thread's FirstSeen table: positions sorted by
// key (stable, so each key's run starts at its first occurrence), then the
// sums in batch order.
size_t SumBySorting(absl::Span<const Key> keys, const float* values,
                    size_t width, BufferPool& pool, Buffer* keys_out,
                    Buffer* values_out) {
  const size_t n = keys.size();
  std::vector<uint32_t> first(n);
  {
    std::vector<uint32_t> order(n);
    std::iota(order.begin(), order.end(), 0u);
    std::stable_sort(order.begin(), order.end(),
                     [&](uint32_t a, uint32_t b) { return keys[a] < keys[b]; });
    for (size_t i = 0; i < n;) {
      size_t j = i;
      while (j < n && keys[order[j]] == keys[order[i]]) {
        first[order[j++]] = order[i];
      }
      i = j;
    }
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
  // FirstSeen records every key of a batch of at most half its entries;
  // past that it would miss repeats, which here change the result.
  if (n > FirstSeen::kMaxEntries / 2) {
    return SumBySorting(keys, values, width, pool, keys_out, values_out);
  }
  return WithFixedWidth(width, [&](auto fixed) {
    return SumInOnePass<decltype(fixed)::value>(keys, values, width, pool,
                                                keys_out, values_out);
  });
}

}  // namespace downpour
