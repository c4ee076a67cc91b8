#include "scheduler/splits.h"

#include "common/test_util.h"

namespace downpour {
namespace {

// Servers 1..n, alive; one dense table (id 1, "t") of keys [0, 400) in
// four ranges of 100, range i on server i % n + 1 with the next server
// as an in-sync backup when n > 1.
proto::ClusterMap Cluster(int n) {
  proto::ClusterMap map;
  map.set_epoch(1);
  for (int i = 1; i <= n; ++i) {
    proto::NodeInfo* node = map.add_nodes();
    node->set_id(i);
    node->set_role(proto::SERVER);
    node->set_state(proto::ALIVE);
  }
  proto::TableMap* t = map.add_tables();
  t->mutable_spec()->set_id(1);
  t->mutable_spec()->set_name("t");
  t->mutable_spec()->set_kind(proto::DENSE);
  t->mutable_spec()->set_width(1);
  t->mutable_spec()->set_num_keys(400);
  for (int i = 0; i < 4; ++i) {
    proto::RangeAssignment* r = t->add_ranges();
    r->set_begin(100 * i);
    r->set_end(100 * (i + 1));
    r->set_primary(i % n + 1);
    if (n > 1) r->add_replicas((i + 1) % n + 1);
  }
  return map;
}

const proto::RangeAssignment& Range(const proto::ClusterMap& map, int i) {
  return map.tables(0).ranges(i);
}

TEST(SplitsTest, SplitKeepsHoldersAndKeyOrder) {
  proto::ClusterMap map = Cluster(2);
  absl::StatusOr<proto::RangeAssignment> r = StartSplit(&map, 1, 130);
  ASSERT_OK(r.status());
  EXPECT_EQ(r->begin(), 100u);
  EXPECT_EQ(r->split_at(), 130u);
  EXPECT_EQ(SplitsUnderWay(map), 1);
  // Only its primary's report finishes it.
  EXPECT_EQ(FinishSplit(&map, 1, 100, /*primary=*/1).code(),
            absl::StatusCode::kFailedPrecondition);
  ASSERT_OK(FinishSplit(&map, 1, 100, /*primary=*/2));
  EXPECT_EQ(SplitsUnderWay(map), 0);
  ASSERT_EQ(map.tables(0).ranges_size(), 5);
  const std::vector<std::pair<Key, Key>> want = {
      {0, 100}, {100, 130}, {130, 200}, {200, 300}, {300, 400}};
  for (int i = 0; i < 5; ++i) {
    EXPECT_EQ(Range(map, i).begin(), want[i].first) << i;
    EXPECT_EQ(Range(map, i).end(), want[i].second) << i;
    EXPECT_EQ(Range(map, i).split_at(), 0u) << i;
  }
  for (int i : {1, 2}) {
    EXPECT_EQ(Range(map, i).primary(), 2u);
    ASSERT_EQ(Range(map, i).replicas_size(), 1);
    EXPECT_EQ(Range(map, i).replicas(0), 1u);
  }
  // Once is enough: a repeated report is refused.
  EXPECT_EQ(FinishSplit(&map, 1, 100, 2).code(),
            absl::StatusCode::kFailedPrecondition);
}

TEST(SplitsTest, RefusesWhatCannotBeSplit) {
  proto::ClusterMap map = Cluster(2);
  EXPECT_EQ(StartSplit(&map, 7, 10).status().code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(StartSplit(&map, 1, 400).status().code(),
            absl::StatusCode::kOutOfRange);
  // A key that already begins a range.
  absl::Status at_begin = StartSplit(&map, 1, 200).status();
  EXPECT_EQ(at_begin.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(at_begin.message()),
              ::testing::HasSubstr("already begins"));
  // A range of one key.
  ASSERT_OK(StartSplit(&map, 1, 399).status());
  ASSERT_OK(FinishSplit(&map, 1, 300, Range(map, 3).primary()));
  absl::Status one = StartSplit(&map, 1, 399).status();
  EXPECT_EQ(one.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(one.message()),
              ::testing::HasSubstr("holds one key"));
  // Busy ranges: retry later.
  map.mutable_tables(0)->mutable_ranges(0)->add_catching_up(2);
  EXPECT_EQ(StartSplit(&map, 1, 50).status().code(),
            absl::StatusCode::kUnavailable);
  map.mutable_tables(0)->mutable_ranges(1)->set_move_to(1);
  EXPECT_EQ(StartSplit(&map, 1, 150).status().code(),
            absl::StatusCode::kUnavailable);
  ASSERT_OK(StartSplit(&map, 1, 250).status());
  EXPECT_EQ(StartSplit(&map, 1, 260).status().code(),
            absl::StatusCode::kUnavailable);
  // A bounded sparse table: its pieces' caps follow their keys, so it is
  // cut only near the middle ([0, 100): no piece under 100 / 8 keys).
  proto::ClusterMap bounded = Cluster(2);
  proto::TableSpec* spec = bounded.mutable_tables(0)->mutable_spec();
  spec->set_kind(proto::SPARSE);
  spec->mutable_bounds()->set_max_rows(10);
  for (Key uneven : {Key{5}, Key{12}, Key{88}, Key{95}}) {
    absl::Status b = StartSplit(&bounded, 1, uneven).status();
    EXPECT_EQ(b.code(), absl::StatusCode::kFailedPrecondition) << uneven;
    EXPECT_THAT(std::string(b.message()), ::testing::HasSubstr("bounded"));
  }
  EXPECT_OK(StartSplit(&bounded, 1, 13).status());
  EXPECT_OK(StartSplit(&bounded, 1, 150).status());
}

TEST(SplitsTest, StaleSplitsAreCancelled) {
  proto::ClusterMap map = Cluster(2);
  ASSERT_OK(StartSplit(&map, 1, 50).status());
  ASSERT_OK(StartSplit(&map, 1, 150).status());
  EXPECT_FALSE(CancelStaleSplits(&map));
  // A new backup copying range 0 (its old one died): cancelled.
  map.mutable_tables(0)->mutable_ranges(0)->add_catching_up(1);
  EXPECT_TRUE(CancelStaleSplits(&map));
  EXPECT_EQ(Range(map, 0).split_at(), 0u);
  EXPECT_EQ(Range(map, 1).split_at(), 150u);
  // Range 1's primary dies: cancelled too.
  map.mutable_nodes(1)->set_state(proto::DEAD);
  EXPECT_TRUE(CancelStaleSplits(&map));
  EXPECT_EQ(SplitsUnderWay(map), 0);
  ASSERT_OK(StartSplit(&map, 1, 250).status());
  EXPECT_TRUE(CancelSplits(&map));
  EXPECT_EQ(SplitsUnderWay(map), 0);
}

TEST(SplitsTest, PicksTheHottestRangeOfTheBusiestServer) {
  proto::ClusterMap map = Cluster(4);
  // No backups: each server's load is its range's.
  for (auto& r : *map.mutable_tables(0)->mutable_ranges()) r.clear_replicas();
  absl::flat_hash_map<std::pair<TableId, Key>, uint64_t> load = {
      {{1, 0}, 1000}, {{1, 100}, 100}, {{1, 200}, 100}, {{1, 300}, 100}};
  absl::flat_hash_map<std::pair<TableId, Key>, Key> keys = {
      {{1, 0}, 7}, {{1, 100}, 150}, {{1, 200}, 250}, {{1, 300}, 350}};
  std::optional<SplitChoice> c = PickSplit(map, load, keys, 1.3);
  ASSERT_TRUE(c.has_value());
  EXPECT_EQ(c->begin, 0u);
  EXPECT_EQ(c->at, 7u);
  // A median key at the range's first key cannot split it.
  keys[{1, 0}] = 0;
  EXPECT_FALSE(PickSplit(map, load, keys, 1.3).has_value());
  // Balanced enough: nothing.
  keys[{1, 0}] = 7;
  load[{1, 0}] = 120;
  EXPECT_FALSE(PickSplit(map, load, keys, 1.3).has_value());
}

// Merges: Cluster(2) puts every range on servers 1 and 2 (primaries
// alternating), Cluster(3) each range on a pair of its own.
TEST(SplitsTest, MergeJoinsNeighboursUnderTheLowerPrimary) {
  proto::ClusterMap map = Cluster(2);
  Key end = 0;
  absl::StatusOr<proto::RangeAssignment> r = StartMerge(&map, 1, 150, &end);
  ASSERT_OK(r.status());
  EXPECT_EQ(r->begin(), 100u);
  EXPECT_EQ(r->end(), 200u);
  EXPECT_EQ(end, 300u);
  EXPECT_EQ(Range(map, 1).merge(), proto::RangeAssignment::MERGE_WITH_NEXT);
  EXPECT_EQ(Range(map, 2).merge(), proto::RangeAssignment::MERGE_WITH_PREVIOUS);
  EXPECT_EQ(MergesUnderWay(map), 1);
  // Either neighbour's report names the lower range.
  for (Key begin : {100, 200}) {
    absl::StatusOr<Key> lower = MergeLowerBegin(map, 1, begin);
    ASSERT_OK(lower.status());
    EXPECT_EQ(*lower, 100u) << begin;
  }
  EXPECT_EQ(MergeLowerBegin(map, 1, 0).status().code(),
            absl::StatusCode::kFailedPrecondition);
  // A range being merged is not split, and not merged again.
  EXPECT_EQ(StartSplit(&map, 1, 250).status().code(),
            absl::StatusCode::kUnavailable);
  EXPECT_EQ(StartMerge(&map, 1, 50, &end).status().code(),
            absl::StatusCode::kUnavailable);
  ASSERT_OK(FinishMerge(&map, 1, 100));
  EXPECT_EQ(MergesUnderWay(map), 0);
  ASSERT_EQ(map.tables(0).ranges_size(), 3);
  const std::vector<std::pair<Key, Key>> want = {
      {0, 100}, {100, 300}, {300, 400}};
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(Range(map, i).begin(), want[i].first) << i;
    EXPECT_EQ(Range(map, i).end(), want[i].second) << i;
    EXPECT_EQ(Range(map, i).merge(), proto::RangeAssignment::NO_MERGE) << i;
  }
  EXPECT_EQ(Range(map, 1).primary(), 2u);
  ASSERT_EQ(Range(map, 1).replicas_size(), 1);
  EXPECT_EQ(Range(map, 1).replicas(0), 1u);
  // Once is enough.
  EXPECT_EQ(FinishMerge(&map, 1, 100).code(),
            absl::StatusCode::kFailedPrecondition);
  // Not when a copy began meanwhile (a failover during the merge).
  proto::ClusterMap copying = Cluster(2);
  ASSERT_OK(StartMerge(&copying, 1, 50, &end).status());
  copying.mutable_tables(0)->mutable_ranges(1)->add_catching_up(3);
  EXPECT_EQ(FinishMerge(&copying, 1, 0).code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(copying.tables(0).ranges_size(), 4);
}

TEST(SplitsTest, RefusesWhatCannotBeMerged) {
  proto::ClusterMap map = Cluster(2);
  Key end = 0;
  EXPECT_EQ(StartMerge(&map, 7, 10, &end).status().code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(StartMerge(&map, 1, 400, &end).status().code(),
            absl::StatusCode::kOutOfRange);
  absl::Status last = StartMerge(&map, 1, 350, &end).status();
  EXPECT_EQ(last.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(last.message()), ::testing::HasSubstr("last range"));
  // A neighbour being copied to a new backup: later.
  map.mutable_tables(0)->mutable_ranges(1)->add_catching_up(3);
  EXPECT_EQ(StartMerge(&map, 1, 50, &end).status().code(),
            absl::StatusCode::kUnavailable);
  // Neighbours on different servers.
  proto::ClusterMap three = Cluster(3);
  absl::Status apart = StartMerge(&three, 1, 50, &end).status();
  EXPECT_EQ(apart.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(apart.message()),
              ::testing::HasSubstr("different servers"));
  EXPECT_EQ(MergesUnderWay(map) + MergesUnderWay(three), 0);
  // A bounded sparse table's neighbours merge: their caps add up.
  proto::ClusterMap bounded = Cluster(2);
  bounded.mutable_tables(0)->mutable_spec()->set_kind(proto::SPARSE);
  bounded.mutable_tables(0)->mutable_spec()->mutable_bounds()->set_max_rows(10);
  EXPECT_OK(StartMerge(&bounded, 1, 50, &end).status());
}

// A table that aggregates BSP steps keeps each merged half's steps apart:
// the merged range lists where they met; a split there makes it a range
// boundary again, and other splits share the cuts out.
TEST(SplitsTest, BspMergesKeepStepCutsThatSplitsShareOut) {
  proto::ClusterMap map = Cluster(2);
  map.mutable_tables(0)->mutable_spec()->set_sync_workers(2);
  auto cuts = [&](int i) {
    const proto::RangeAssignment& r = Range(map, i);
    return std::vector<Key>(r.step_cuts().begin(), r.step_cuts().end());
  };
  Key end = 0;
  // [0, 100) + [100, 200), then + [200, 300).
  ASSERT_OK(StartMerge(&map, 1, 50, &end).status());
  ASSERT_OK(FinishMerge(&map, 1, 0));
  EXPECT_EQ(cuts(0), (std::vector<Key>{100}));
  ASSERT_OK(StartMerge(&map, 1, 50, &end).status());
  ASSERT_OK(FinishMerge(&map, 1, 0));
  EXPECT_EQ(Range(map, 0).end(), 300u);
  EXPECT_EQ(cuts(0), (std::vector<Key>{100, 200}));
  // A split at a cut: [0, 100) and [100, 300) with the cut at 200.
  ASSERT_OK(StartSplit(&map, 1, 100).status());
  ASSERT_OK(FinishSplit(&map, 1, 0, Range(map, 0).primary()));
  EXPECT_TRUE(cuts(0).empty());
  EXPECT_EQ(cuts(1), (std::vector<Key>{200}));
  // Elsewhere: each piece keeps the cuts inside it.
  ASSERT_OK(StartSplit(&map, 1, 250).status());
  ASSERT_OK(FinishSplit(&map, 1, 100, Range(map, 1).primary()));
  EXPECT_EQ(Range(map, 1).end(), 250u);
  EXPECT_EQ(cuts(1), (std::vector<Key>{200}));
  EXPECT_TRUE(cuts(2).empty());
  // Other tables' merges leave no cuts.
  proto::ClusterMap plain = Cluster(2);
  ASSERT_OK(StartMerge(&plain, 1, 50, &end).status());
  ASSERT_OK(FinishMerge(&plain, 1, 0));
  EXPECT_EQ(plain.tables(0).ranges(0).step_cuts_size(), 0);
}

TEST(SplitsTest, StaleMergesAreCancelled) {
  proto::ClusterMap map = Cluster(2);
  Key end = 0;
  ASSERT_OK(StartMerge(&map, 1, 50, &end).status());
  EXPECT_FALSE(CancelStaleSplits(&map));
  // The upper neighbour gets a backup to copy: both are called off.
  map.mutable_tables(0)->mutable_ranges(1)->add_catching_up(3);
  EXPECT_TRUE(CancelStaleSplits(&map));
  EXPECT_EQ(Range(map, 0).merge(), proto::RangeAssignment::NO_MERGE);
  EXPECT_EQ(Range(map, 1).merge(), proto::RangeAssignment::NO_MERGE);
  EXPECT_EQ(FinishMerge(&map, 1, 0).code(),
            absl::StatusCode::kFailedPrecondition);
  // A primary dies.
  proto::ClusterMap dies = Cluster(2);
  ASSERT_OK(StartMerge(&dies, 1, 250, &end).status());
  dies.mutable_nodes(0)->set_state(proto::DEAD);
  EXPECT_TRUE(CancelStaleSplits(&dies));
  EXPECT_EQ(MergesUnderWay(dies), 0);
  // Not reported in time.
  proto::ClusterMap slow = Cluster(2);
  ASSERT_OK(StartMerge(&slow, 1, 250, &end).status());
  EXPECT_TRUE(CancelSplits(&slow));
  EXPECT_EQ(MergesUnderWay(slow), 0);
  EXPECT_EQ(Range(slow, 3).merge(), proto::RangeAssignment::NO_MERGE);
}

TEST(SplitsTest, PicksTheColdestNeighboursOnTheSameServers) {
  proto::ClusterMap map = Cluster(2);
  absl::flat_hash_map<std::pair<TableId, Key>, uint64_t> load = {
      {{1, 0}, 100}, {{1, 100}, 5}, {{1, 200}, 5}, {{1, 300}, 100}};
  // The mean is 52.5; [100, 200) and [200, 300) weigh 10 together.
  std::optional<SplitChoice> c = PickMerge(map, load, {}, 0.25);
  ASSERT_TRUE(c.has_value());
  EXPECT_EQ(c->table, 1u);
  EXPECT_EQ(c->begin, 100u);
  EXPECT_EQ(c->at, 200u);
  // A young boundary is left alone, and no other pair is cold enough.
  EXPECT_FALSE(PickMerge(map, load, {{1, 200}}, 0.25).has_value());
  // Unmeasured is not cold; nothing measured, nothing merged.
  load.erase({1, 200});
  EXPECT_FALSE(PickMerge(map, load, {}, 0.25).has_value());
  EXPECT_FALSE(PickMerge(map, {}, {}, 0.25).has_value());
  // Neighbours on different servers are not merged, however cold.
  proto::ClusterMap three = Cluster(3);
  absl::flat_hash_map<std::pair<TableId, Key>, uint64_t> cold = {
      {{1, 0}, 100}, {{1, 100}, 1}, {{1, 200}, 1}, {{1, 300}, 100}};
  EXPECT_FALSE(PickMerge(three, cold, {}, 0.25).has_value());
}

}  // namespace
}  // namespace downpour
