// What a row of a bounded sparse table costs, and how a table's row cap
// (TableSpec.bounds) is split over its ranges: one formula for the
// scheduler (which checks caps against the servers' memory) and the servers
// (which keep them). Pure; thread-safe.
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

// The rows one range of a table with `num_ranges` ranges may hold: the
// table's cap (`max_rows`, or `max_bytes` of SparseRowBytes rows; 0: none)
// split evenly, rounded up. 0: no cap.
inline constexpr uint64_t RangeRowCap(uint64_t max_rows, uint64_t max_bytes,
                                      size_t width, size_t state_width,
                                      size_t num_ranges) {
  const uint64_t cap =
      max_rows > 0
          ? max_rows
          : (max_bytes > 0 ? max_bytes / SparseRowBytes(width, state_width)
                           : 0);
  const uint64_t n = num_ranges == 0 ? 1 : num_ranges;
  return cap == 0 ? 0 : cap / n + (cap % n != 0 ? 1 : 0);
}

}  // namespace downpour

#endif  // DOWNPOUR_COMMON_SPARSE_ROW_BYTES_H_
