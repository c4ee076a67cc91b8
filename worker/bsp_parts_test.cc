#include "worker/bsp_parts.h"

#include <gtest/gtest.h>

#include <vector>

namespace downpour {
namespace {

std::vector<ParamBlock> Blocks() {
  return {{"w1", 784, 256},     // 784 KiB: parts of 128 rows, the last of 16
          {"b1", 1, 256},       // one row
          {"w2", 256, 10},      // 10 KiB: one part
          {"wide", 3, 40000}};  // a row above the part size: a row a part
}

TEST(BspPartsTest, TablesAreCutIntoRowRangesOfThePartSizeCoveringEveryFloat) {
  const std::vector<BspPart> parts = CutBspParts(Blocks());
  ASSERT_EQ(parts.size(), 7u + 1 + 1 + 3);
  size_t offset = 0;
  for (const BspPart& p : parts) {
    EXPECT_EQ(p.offset, offset) << "parts follow each other";
    EXPECT_EQ(p.count, (p.end - p.begin) * Blocks()[p.table].width);
    EXPECT_LE(p.count * sizeof(float),
              std::max<size_t>(kBspPartBytes,
                               Blocks()[p.table].width * sizeof(float)));
    offset += p.count;
  }
  EXPECT_EQ(offset, 784u * 256 + 256 + 256 * 10 + 3 * 40000);
  EXPECT_EQ(parts[0].table, 0u);
  EXPECT_EQ(parts[0].end - parts[0].begin, 128u);
  EXPECT_EQ(parts[6].begin, 768u);
  EXPECT_EQ(parts[6].end, 784u);
  EXPECT_EQ(parts[7].table, 1u);
  EXPECT_EQ(parts[9].table, 3u);
  EXPECT_EQ(parts[11].begin, 2u);
}

// The gradient reported as the streamed backward pass does (last layer
// first, in stretches that do not follow part boundaries): each part is
// handed out once, exactly when its last float is final, and again after
// a reset.
TEST(BspPartsTest, APartIsDoneOnceWhenItsLastFloatIsFinal) {
  BspPartTracker tracker(CutBspParts(Blocks()));
  const size_t total =
      tracker.parts().back().offset + tracker.parts().back().count;
  for (int step = 0; step < 2; ++step) {
    tracker.Reset();
    std::vector<bool> final(total, false);
    std::vector<int> done(tracker.parts().size(), 0);
    size_t end = total;
    const size_t stretch = 7777;
    while (end > 0) {
      const size_t begin = end > stretch ? end - stretch : 0;
      for (size_t i = begin; i < end; ++i) final[i] = true;
      tracker.Ready(begin, end - begin, [&](const BspPart& p) {
        for (size_t i = p.offset; i < p.offset + p.count; ++i) {
          ASSERT_TRUE(final[i]) << "part at " << p.offset << " early";
        }
        ++done[&p - tracker.parts().data()];
      });
      // Every part whose floats are all final is done by now.
      for (size_t k = 0; k < tracker.parts().size(); ++k) {
        const BspPart& p = tracker.parts()[k];
        EXPECT_EQ(done[k], p.offset >= begin ? 1 : 0) << "part " << k;
      }
      end = begin;
    }
  }
}

}  // namespace
}  // namespace downpour
