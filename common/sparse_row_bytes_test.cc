#include "common/sparse_row_bytes.h"

#include <cstdint>
#include <vector>

#include "common/types.h"
#include "gtest/gtest.h"

namespace downpour {
namespace {

// The key space cut evenly into n ranges, as the scheduler places a table.
std::vector<uint64_t> EvenExtents(size_t n) {
  std::vector<uint64_t> out;
  Key begin = 0;
  for (size_t i = 0; i < n; ++i) {
    const Key next = static_cast<Key>(
        static_cast<unsigned __int128>(kKeySpaceEnd) * (i + 1) / n);
    out.push_back(next - begin);
    begin = next;
  }
  return out;
}

TEST(SparseRowBytesTest, EvenRangesEachHoldTheCapOverNRoundedUp) {
  for (uint64_t cap : {uint64_t{1}, uint64_t{7}, uint64_t{300}, uint64_t{301},
                       uint64_t{1} << 40}) {
    for (size_t n : {1, 2, 3, 4, 7, 1000}) {
      for (uint64_t extent : EvenExtents(n)) {
        EXPECT_EQ(KeySpaceShare(cap, extent, kKeySpaceEnd),
                  cap / n + (cap % n != 0 ? 1 : 0))
            << "cap " << cap << ", " << n << " ranges";
      }
    }
  }
}

TEST(SparseRowBytesTest, PiecesOfASplitShareTheirRangesCap) {
  const uint64_t cap = 1000;
  const uint64_t half = kKeySpaceEnd / 2;
  const uint64_t quarter = half / 2;
  EXPECT_EQ(KeySpaceShare(cap, half, kKeySpaceEnd), 500u);
  EXPECT_EQ(KeySpaceShare(cap, quarter, kKeySpaceEnd), 250u);
  EXPECT_EQ(KeySpaceShare(cap, half - quarter, kKeySpaceEnd), 250u);
  // A merge adds the shares back.
  EXPECT_EQ(KeySpaceShare(cap, quarter + (half - quarter), kKeySpaceEnd), 500u);
  // A sliver of the key space still holds a row; nothing holds nothing.
  EXPECT_EQ(KeySpaceShare(cap, 1000, kKeySpaceEnd), 1u);
  EXPECT_EQ(KeySpaceShare(cap, 0, kKeySpaceEnd), 0u);
  EXPECT_EQ(KeySpaceShare(0, half, kKeySpaceEnd), 0u);
  EXPECT_EQ(KeySpaceShare(cap, kKeySpaceEnd, kKeySpaceEnd), cap);
}

TEST(SparseRowBytesTest, ACapInBytesCountsWholeRows) {
  const uint64_t row = SparseRowBytes(16, 16);  // Adagrad-like state
  EXPECT_EQ(row, 32u * 4 + kSparseRowOverheadBytes);
  EXPECT_EQ(TableRowCap(0, 10 * row + row - 1, 16, 16), 10u);
  EXPECT_EQ(TableRowCap(5, 0, 16, 16), 5u);
  EXPECT_EQ(RangeRowCap(0, 0, 16, 16, kKeySpaceEnd, kKeySpaceEnd), 0u);
}

}  // namespace
}  // namespace downpour
