// SplitByOwner: the routing of key batches, without a cluster.
#include "client/split_by_owner.h"

#include <numeric>
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

}  // namespace
}  // namespace downpour
