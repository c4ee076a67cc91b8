// SplitByOwner: the routing of key batches, without a cluster.
#include "client/split_by_owner.h"

#include <numeric>
#include <random>
#include <vector>

#include "common/test_util.h"

namespace downpour {
namespace {

// Keys [0, 30): [0, 10) on server 7, [10, 20) on server 8, [20, 30) on
// server 7 again (a server may hold several ranges).
proto::TableMap Table() {
  proto::TableMap t;
  t.mutable_spec()->set_name("t");
  auto add = [&](Key b, Key e, NodeId s) {
    proto::RangeAssignment* r = t.add_ranges();
    r->set_begin(b);
    r->set_end(e);
    r->set_primary(s);
  };
  add(0, 10, 7);
  add(10, 20, 8);
  add(20, 30, 7);
  return t;
}

std::vector<size_t> All(size_t n) {
  std::vector<size_t> p(n);
  std::iota(p.begin(), p.end(), 0);
  return p;
}

TEST(SplitByOwnerTest, GroupsByRangeInKeyOrderKeepingTheCallersOrder) {
  const std::vector<Key> keys = {25, 3, 12, 9, 3, 21, 0};
  ASSERT_OK_AND_ASSIGN(std::vector<OwnerGroup> g,
                       SplitByOwner(Table(), keys, All(keys.size())));
  ASSERT_EQ(g.size(), 3u);
  EXPECT_EQ(g[0].range, 0);
  EXPECT_EQ(g[0].server, 7u);
  EXPECT_EQ(g[0].positions, (std::vector<size_t>{1, 3, 4, 6}));
  EXPECT_EQ(g[1].range, 1);
  EXPECT_EQ(g[1].server, 8u);
  EXPECT_EQ(g[1].positions, (std::vector<size_t>{2}));
  // Server 7's second range is a group of its own.
  EXPECT_EQ(g[2].range, 2);
  EXPECT_EQ(g[2].server, 7u);
  EXPECT_EQ(g[2].positions, (std::vector<size_t>{0, 5}));
}

TEST(SplitByOwnerTest, RangesWithoutKeysAreLeftOut) {
  const std::vector<Key> keys = {11, 19, 10};
  ASSERT_OK_AND_ASSIGN(std::vector<OwnerGroup> g,
                       SplitByOwner(Table(), keys, All(keys.size())));
  ASSERT_EQ(g.size(), 1u);
  EXPECT_EQ(g[0].range, 1);
  EXPECT_EQ(g[0].server, 8u);
  EXPECT_EQ(g[0].positions, (std::vector<size_t>{0, 1, 2}));
  ASSERT_OK_AND_ASSIGN(g, SplitByOwner(Table(), keys, {}));
  EXPECT_TRUE(g.empty());
}

TEST(SplitByOwnerTest, OnlyTheGivenPositions) {
  // A retried part: positions 4 and 1 of the batch only.
  const std::vector<Key> keys = {25, 3, 12, 9, 29};
  ASSERT_OK_AND_ASSIGN(std::vector<OwnerGroup> g,
                       SplitByOwner(Table(), keys, std::vector<size_t>{4, 1}));
  ASSERT_EQ(g.size(), 2u);
  EXPECT_EQ(g[0].positions, (std::vector<size_t>{1}));
  EXPECT_EQ(g[1].positions, (std::vector<size_t>{4}));
}

TEST(SplitByOwnerTest, EveryRangeListsTheEmptyOnesToo) {
  const std::vector<Key> keys = {25, 3, 21};
  SplitOptions every;
  every.every_range = true;
  ASSERT_OK_AND_ASSIGN(std::vector<OwnerGroup> g,
                       SplitByOwner(Table(), keys, All(3), every));
  ASSERT_EQ(g.size(), 3u);
  EXPECT_EQ(g[0].positions, (std::vector<size_t>{1}));
  EXPECT_EQ(g[1].range, 1);
  EXPECT_EQ(g[1].server, 8u);
  EXPECT_TRUE(g[1].positions.empty());
  EXPECT_EQ(g[2].positions, (std::vector<size_t>{0, 2}));
  // An empty batch still reaches every range.
  ASSERT_OK_AND_ASSIGN(g, SplitByOwner(Table(), {}, {}, every));
  ASSERT_EQ(g.size(), 3u);
  for (const OwnerGroup& group : g) EXPECT_TRUE(group.positions.empty());
}

TEST(SplitByOwnerTest, KeyOutsideTheKeySpaceIsOutOfRange) {
  const std::vector<Key> keys = {3, 30, 31};
  auto g = SplitByOwner(Table(), keys, All(keys.size()));
  EXPECT_THAT(g, StatusIs(absl::StatusCode::kOutOfRange));
  EXPECT_EQ(g.status().message(), "key 30 is outside the table's key space");
  // A gap between ranges is outside too.
  proto::TableMap gap = Table();
  gap.mutable_ranges(1)->set_begin(15);
  EXPECT_THAT(SplitByOwner(gap, std::vector<Key>{12}, All(1)),
              StatusIs(absl::StatusCode::kOutOfRange));
  // No ranges at all: every key is outside.
  EXPECT_THAT(SplitByOwner(proto::TableMap(), std::vector<Key>{0}, All(1)),
              StatusIs(absl::StatusCode::kOutOfRange));
}

TEST(RangeLocatorTest, FindsTheRangeOrNone) {
  const RangeLocator ranges(Table());
  ASSERT_EQ(ranges.size(), 3);
  EXPECT_EQ(ranges.Find(0), 0);
  EXPECT_EQ(ranges.Find(9), 0);
  EXPECT_EQ(ranges.Find(10), 1);
  EXPECT_EQ(ranges.Find(29), 2);
  EXPECT_EQ(ranges.Find(30), -1);
  EXPECT_EQ(ranges.server(1), 8u);
  // Many ranges (a binary search), with a gap between two of them.
  proto::TableMap many;
  for (Key b = 0; b < 200; b += 10) {
    if (b == 50) continue;  // the gap [50, 60)
    proto::RangeAssignment* r = many.add_ranges();
    r->set_begin(b);
    r->set_end(b + 10);
    r->set_primary(static_cast<NodeId>(b / 10));
  }
  const RangeLocator m(many);
  for (Key k = 0; k < 210; ++k) {
    const int r = m.Find(k);
    if (k >= 200 || (k >= 50 && k < 60)) {
      EXPECT_EQ(r, -1) << k;
    } else {
      ASSERT_GE(r, 0) << k;
      EXPECT_EQ(m.server(r), k / 10) << k;
    }
  }
  EXPECT_EQ(RangeLocator(proto::TableMap()).Find(0), -1);
}

TEST(PlanSplitTest, OneRangeIsOneRunAndSaysWhetherTheKeysAreConsecutive) {
  const RangeLocator ranges(Table());
  const std::vector<Key> run = {3, 4, 5, 6, 7};
  ASSERT_OK_AND_ASSIGN(BatchSplit s,
                       PlanSplit(ranges, run, Selection::Slice(0, 5)));
  ASSERT_EQ(s.groups.size(), 1u);
  EXPECT_EQ(s.groups[0].range, 0);
  EXPECT_EQ(s.groups[0].count, 5u);
  EXPECT_EQ(s.groups[0].start, 0u);
  EXPECT_TRUE(s.runs);
  EXPECT_TRUE(s.consecutive);
  ASSERT_OK_AND_ASSIGN(s, PlanSplit(ranges, run, Selection::Slice(1, 3)));
  EXPECT_EQ(s.groups[0].count, 3u);
  EXPECT_TRUE(s.consecutive);
  const std::vector<Key> gaps = {3, 5, 4, 4};
  ASSERT_OK_AND_ASSIGN(s, PlanSplit(ranges, gaps, Selection::Slice(0, 4)));
  EXPECT_TRUE(s.runs);
  EXPECT_FALSE(s.consecutive);
}

TEST(PlanSplitTest, SortedKeysOverSeveralRangesAreRuns) {
  const RangeLocator ranges(Table());
  const std::vector<Key> keys = {1, 2, 2, 15, 16, 22};
  ASSERT_OK_AND_ASSIGN(BatchSplit s,
                       PlanSplit(ranges, keys, Selection::Slice(0, 6)));
  EXPECT_TRUE(s.runs);
  EXPECT_FALSE(s.consecutive);
  ASSERT_EQ(s.groups.size(), 3u);
  EXPECT_EQ(s.groups[0].count, 3u);
  EXPECT_EQ(s.groups[0].start, 0u);
  EXPECT_EQ(s.groups[1].range, 1);
  EXPECT_EQ(s.groups[1].count, 2u);
  EXPECT_EQ(s.groups[1].start, 3u);
  EXPECT_EQ(s.groups[2].start, 5u);
}

TEST(PlanSplitTest, ScatteredKeysAreCountedPerRange) {
  const RangeLocator ranges(Table());
  const std::vector<Key> keys = {25, 3, 12, 9, 3, 21, 0};
  ASSERT_OK_AND_ASSIGN(BatchSplit s,
                       PlanSplit(ranges, keys, Selection::Slice(0, 7)));
  EXPECT_FALSE(s.runs);
  ASSERT_EQ(s.groups.size(), 3u);
  EXPECT_EQ(s.groups[0].count, 4u);
  EXPECT_EQ(s.groups[1].count, 1u);
  EXPECT_EQ(s.groups[2].count, 2u);
  // Only positions 4 and 1 (a retried part).
  const std::vector<size_t> some = {4, 1};
  ASSERT_OK_AND_ASSIGN(s, PlanSplit(ranges, keys, Selection::List(some)));
  ASSERT_EQ(s.groups.size(), 1u);
  EXPECT_EQ(s.groups[0].count, 2u);
}

TEST(PlanSplitTest, TheFirstKeyOutsideIsOutOfRange) {
  const RangeLocator ranges(Table());
  // Past the first blocks of the fast path, then in the key-by-key path.
  std::vector<Key> keys(1000, 5);
  keys[700] = 31;
  keys[900] = 30;
  auto s = PlanSplit(ranges, keys, Selection::Slice(0, keys.size()));
  EXPECT_THAT(s, StatusIs(absl::StatusCode::kOutOfRange));
  EXPECT_EQ(s.status().message(), "key 31 is outside the table's key space");
  keys[700] = 15;  // two ranges now: the key-by-key path finds key 30
  s = PlanSplit(ranges, keys, Selection::Slice(0, keys.size()));
  EXPECT_EQ(s.status().message(), "key 30 is outside the table's key space");
  ASSERT_OK_AND_ASSIGN(BatchSplit empty,
                       PlanSplit(ranges, keys, Selection::Slice(0, 0)));
  EXPECT_TRUE(empty.groups.empty());
}

// PlanSplit against the plan made key by key in the plainest way, over
// batches of runs, scattered stretches and long one-range stretches, each
// as a slice and as a list of positions: the fast paths and the key-by-key
// one must agree on every group, its start, and both flags.
TEST(PlanSplitTest, AgreesWithAPlanMadeKeyByKey) {
  const uint32_t seed = TestSeed(5);
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937_64 rng(seed);
  const RangeLocator ranges(Table());  // [0, 10), [10, 20), [20, 30)
  for (int round = 0; round < 400; ++round) {
    std::vector<Key> keys;
    const int stretches = 1 + static_cast<int>(rng() % 40);
    for (int t = 0; t < stretches; ++t) {
      const size_t n = 1 + rng() % (rng() % 4 == 0 ? 700 : 12);
      switch (rng() % 4) {
        case 0:  // one range's keys
          for (size_t i = 0, r = rng() % 3; i < n; ++i) {
            keys.push_back(r * 10 + rng() % 10);
          }
          break;
        case 1:  // consecutive keys from wherever they start
          for (Key k = rng() % 30; n > 0 && k < 30 && keys.size() < 100000;
               ++k) {
            keys.push_back(k);
            if (k % 10 == 9 && rng() % 2) break;
          }
          break;
        default:  // scattered
          for (size_t i = 0; i < n; ++i) keys.push_back(rng() % 30);
      }
    }
    std::vector<size_t> list;
    for (size_t i = 0; i < keys.size(); ++i) {
      if (rng() % 3 != 0) list.push_back(i);
    }
    const size_t first = rng() % keys.size();
    const std::vector<Selection> selections = {
        Selection::Slice(0, keys.size()),
        Selection::Slice(first, rng() % (keys.size() - first + 1)),
        Selection::List(list)};
    for (const Selection& sel : selections) {
      // The plan made key by key.
      size_t counts[3] = {0, 0, 0}, starts[3] = {0, 0, 0};
      bool runs = true, consecutive = true;
      int last = -1;
      for (size_t i = 0; i < sel.size(); ++i) {
        const Key k = keys[sel.at(i)];
        const int r = static_cast<int>(k / 10);
        if (r < last) runs = false;
        if (counts[r]++ == 0) starts[r] = i;
        if (i > 0 && k != keys[sel.at(i - 1)] + 1) consecutive = false;
        last = r;
      }
      ASSERT_OK_AND_ASSIGN(BatchSplit s, PlanSplit(ranges, keys, sel));
      size_t g = 0;
      for (int r = 0; r < 3; ++r) {
        if (counts[r] == 0) continue;
        ASSERT_LT(g, s.groups.size());
        EXPECT_EQ(s.groups[g].range, r);
        EXPECT_EQ(s.groups[g].count, counts[r]);
        if (runs) {
          EXPECT_EQ(s.groups[g].start, starts[r]) << "range " << r;
        }
        ++g;
      }
      EXPECT_EQ(g, s.groups.size());
      EXPECT_EQ(s.runs, runs) << keys.size() << " keys, round " << round;
      EXPECT_EQ(s.consecutive, consecutive) << "round " << round;
    }
  }
}

TEST(PlanSplitTest, ConsecutiveRuns) {
  std::vector<Key> keys(1001);
  std::iota(keys.begin(), keys.end(), Key{40});
  EXPECT_TRUE(Consecutive(keys.data(), keys.size()));
  EXPECT_TRUE(Consecutive(keys.data(), 0));
  EXPECT_TRUE(Consecutive(keys.data() + 7, 1));
  keys[998] = 2000;
  EXPECT_FALSE(Consecutive(keys.data(), keys.size()));
  EXPECT_TRUE(Consecutive(keys.data(), 998));
}

// A merged range of a BSP table routes synced pushes per stretch.
TEST(StepStretchesTest, RangesAreCutAtTheirStepCutsWithTheirHolders) {
  proto::TableMap plain = Table();
  proto::TableMap storage;
  EXPECT_EQ(&StepStretches(plain, &storage), &plain);  // nothing to cut
  proto::TableMap merged = Table();
  merged.mutable_ranges(1)->set_end(30);
  merged.mutable_ranges(1)->add_step_cuts(15);
  merged.mutable_ranges(1)->add_step_cuts(20);
  merged.mutable_ranges(1)->add_replicas(9);
  merged.mutable_ranges()->RemoveLast();
  const proto::TableMap& s = StepStretches(merged, &storage);
  ASSERT_EQ(s.ranges_size(), 4);
  const std::vector<std::pair<Key, Key>> want = {
      {0, 10}, {10, 15}, {15, 20}, {20, 30}};
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(s.ranges(i).begin(), want[i].first) << i;
    EXPECT_EQ(s.ranges(i).end(), want[i].second) << i;
    EXPECT_EQ(s.ranges(i).step_cuts_size(), 0) << i;
  }
  EXPECT_EQ(s.ranges(3).primary(), 8u);
  ASSERT_EQ(s.ranges(3).replicas_size(), 1);
  EXPECT_EQ(s.ranges(3).replicas(0), 9u);
  EXPECT_EQ(s.spec().name(), "t");
  // Keys route to stretches, each stretch's group apart.
  const std::vector<Key> keys = {12, 17, 25};
  ASSERT_OK_AND_ASSIGN(std::vector<OwnerGroup> g,
                       SplitByOwner(s, keys, All(keys.size())));
  ASSERT_EQ(g.size(), 3u);
  EXPECT_EQ(g[0].range, 1);
  EXPECT_EQ(g[1].range, 2);
  EXPECT_EQ(g[2].range, 3);
}

}  // namespace
}  // namespace downpour
