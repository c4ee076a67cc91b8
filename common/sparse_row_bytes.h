// What a row of a bounded sparse table costs, and how a table's row cap
// (TableSpec.bounds) is split over its ranges by their share of the key
// space: one formula for the scheduler (which checks caps against the
// servers' memory) and the servers (which keep them). Pure; thread-safe.
#ifndef DOWNPOUR_COMMON_SPARSE_ROW_BYTES_H_
#define DOWNPOUR_COMMON_SPARSE_ROW_BYTES_H_

#include <cstddef>
#include <cstdint>

namespace downpour {

// A row's bytes besides its floats: its key (8), recency links (8), a
// stamp and a use count (8), and its index slot (4 bytes at a load of at
// most 0.8, so up to 8), measured in bench/ps_bench's memory section.
inline constexpr uint64_t kSparseRowOverheadBytes = 32;

// Bytes of one row of `width` floats whose update rule keeps `state_width`
// floats of state per row.
inline constexpr uint64_t SparseRowBytes(size_t width, size_t state_width) {
  return (uint64_t{width} + state_width) * sizeof(float) +
         kSparseRowOverheadBytes;
}

// A table's cap in rows: `max_rows`, or `max_bytes` of SparseRowBytes
// rows (0: no cap).
inline constexpr uint64_t TableRowCap(uint64_t max_rows, uint64_t max_bytes,
                                      size_t width, size_t state_width) {
  return max_rows > 0
             ? max_rows
             : (max_bytes > 0 ? max_bytes / SparseRowBytes(width, state_width)
                              : 0);
}

// The part of a table-wide `total` (a row cap, admission counters) that a
// range of `extent` keys of the table's `key_space` keys holds: its share
// of the key space, rounded up, at least 1 (0 when `total` or `extent` is
// 0). The share follows the keys, not the number of ranges, so that the
// parts still add up to the table's total however its ranges were split
// and merged; it assumes ids spread over the key space, as hashed ids do.
// The initial ranges are the key space cut evenly (scheduler/placement.h),
// each `total / n` rounded up: a tolerance of 2^-20 of a row absorbs the
// rounding of their cuts.
inline uint64_t KeySpaceShare(uint64_t total, uint64_t extent,
                              uint64_t key_space) {
  if (total == 0 || extent == 0 || key_space == 0) return 0;
  if (extent >= key_space) return total;
  using u128 = unsigned __int128;
  const u128 scaled = static_cast<u128>(total) * extent;
  const u128 slack = static_cast<u128>(key_space) >> 20;
  const u128 rows =
      scaled <= slack ? 0 : (scaled - slack + key_space - 1) / key_space;
  return rows == 0 ? 1 : static_cast<uint64_t>(rows);
}

// The rows a range of `extent` keys of a sparse table's key space may
// hold (0: no cap).
inline uint64_t RangeRowCap(uint64_t max_rows, uint64_t max_bytes, size_t width,
                            size_t state_width, uint64_t extent,
                            uint64_t key_space) {
  return KeySpaceShare(TableRowCap(max_rows, max_bytes, width, state_width),
                       extent, key_space);
}

}  // namespace downpour

#endif  // DOWNPOUR_COMMON_SPARSE_ROW_BYTES_H_
