// Splitting key ranges over the real daemons (scheduler/splits.h): a range
// split by hand (psctl split's call) while writers add known amounts
// (tests/exact_writes.h), and kill -9 of the range's primary, of its
// backup and of the scheduler while the range is fenced for the split.
// No add may fail, and every row must hold exactly what was acknowledged;
// bad splits are refused with the reason named. With --balance=load, a
// range whose keys are hot at one end is split by the scheduler itself.
// Merges of neighbours (psctl merge's call) are checked the same way: under
// exactly-once writers, and with kill -9 while both ranges are fenced; with
// --balance=load, cold neighbours are merged by the scheduler itself. A
// bounded sparse table (with a cold tier) is split and merged under the
// same writers, each piece keeping its share of the cap.
#include <signal.h>

#include <functional>
#include <iostream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "cluster/server_admin_client.h"
#include "common/sparse_row_bytes.h"
#include "common/test_util.h"
#include "proto/downpour.pb.h"
#include "tests/cluster_fixture.h"
#include "tests/exact_writes.h"

namespace downpour {
namespace {

enum class Victim { kPrimary, kBackup, kScheduler };

class SplitTest : public ExactClusterTest {
 protected:
  // kill -9 of `victim`: the scheduler (restarted at once), or the
  // primary or first backup of range `a`.
  void Kill(Victim victim, const proto::RangeAssignment& a) {
    if (victim == Victim::kScheduler) {
      std::cout << "kill -9 the scheduler" << std::endl;
      cluster_->scheduler().Signal(SIGKILL);
      EXPECT_OK(cluster_->scheduler().Wait(absl::Seconds(10)));
      ASSERT_OK(cluster_->RestartScheduler());
      return;
    }
    ASSERT_GT(a.replicas_size(), 0);
    const int index =
        IndexOf(victim == Victim::kPrimary ? a.primary() : a.replicas(0));
    ASSERT_GE(index, 0);
    std::cout << "kill -9 server-" << index << std::endl;
    cluster_->server(index).Signal(SIGKILL);
    EXPECT_OK(cluster_->server(index).Wait(absl::Seconds(10)));
  }
  // Kill, then: the writers go on while the split or merge under way is
  // called off (a holder died) or done, every range comes back in sync,
  // and every write is exact.
  void KillAndSettle(Victim victim, const proto::RangeAssignment& a) {
    ASSERT_NO_FATAL_FAILURE(Kill(victim, a));
    AwaitWrites(2000);
    ASSERT_NO_FATAL_FAILURE(Settle());
    StopAndCheck("after the kill");
  }
  // Waits until nothing is under way and every range has 2 holders in sync.
  void Settle() {
    ASSERT_OK(AwaitMap(
                  "nothing under way, every range in sync",
                  [](const proto::ClusterMap& m) { return Settled(m, 2); },
                  absl::Seconds(60))
                  .status());
  }
  absl::StatusOr<proto::SplitRangeReply> Split(const std::string& table,
                                               Key key) {
    proto::SplitRangeRequest req;
    req.set_table(table);
    req.set_key(key);
    return sched_->SplitRange(req);
  }
  absl::StatusOr<proto::SplitRangeReply> Merge(const std::string& table,
                                               Key key) {
    proto::SplitRangeRequest req;
    req.set_table(table);
    req.set_key(key);
    req.set_merge(true);
    return sched_->SplitRange(req);
  }
};

TEST_F(SplitTest, RangesSplitWhileWritesGoOnAndBadSplitsAreRefused) {
  Start(2, {"--replicas=2", "--ranges_per_table=2"});
  writes_->Start(4, 1);
  AwaitWrites(2000);
  // The dense table's first range [0, 1500), twice, and the sparse
  // table's upper range in its middle.
  ASSERT_OK(SplitAndAwait(*sched_, "dense", 700, absl::Seconds(90)));
  AwaitWrites(2000);
  ASSERT_OK(SplitAndAwait(*sched_, "dense", 701, absl::Seconds(90)));
  const Key sparse_at = (Key{1} << 63) + (Key{1} << 62);
  ASSERT_OK(SplitAndAwait(*sched_, "sparse", sparse_at, absl::Seconds(90)));
  AwaitWrites(2000);
  ASSERT_OK_AND_ASSIGN(
      proto::ClusterMap map,
      AwaitMap(
          "quiet", [](const proto::ClusterMap& m) { return Settled(m, 2); },
          absl::Seconds(60)));
  EXPECT_EQ(TableNamed(map, "dense")->ranges_size(), 4);
  EXPECT_EQ(TableNamed(map, "sparse")->ranges_size(), 3);
  StopAndCheck("after three splits");

  // Bad splits: a range of one key, a key that begins a range, a key
  // outside the key space, a table that does not exist.
  absl::Status one = Split("dense", 700).status();
  EXPECT_EQ(one.code(), absl::StatusCode::kFailedPrecondition) << one;
  EXPECT_THAT(std::string(one.message()), ::testing::HasSubstr("one key"));
  absl::Status begins = Split("dense", 701).status();
  EXPECT_EQ(begins.code(), absl::StatusCode::kFailedPrecondition) << begins;
  EXPECT_EQ(Split("dense", 3000).status().code(),
            absl::StatusCode::kOutOfRange);
  EXPECT_EQ(Split("nope", 5).status().code(), absl::StatusCode::kNotFound);
}

// kill -9 while the range is fenced: its primary reports it quiet a while
// late (--inject_handover_delay_ms), and the victim dies meanwhile.

std::string VictimName(const ::testing::TestParamInfo<Victim>& info) {
  switch (info.param) {
    case Victim::kPrimary:
      return "Primary";
    case Victim::kBackup:
      return "Backup";
    default:
      return "Scheduler";
  }
}

class KillDuringASplitTest : public SplitTest,
                             public ::testing::WithParamInterface<Victim> {};

TEST_P(KillDuringASplitTest, NothingIsLost) {
  const Victim victim = GetParam();
  Start(3, {"--replicas=2", "--ranges_per_table=2"},
        {"--inject_handover_delay_ms=1500"},
        /*durable=*/victim == Victim::kScheduler);
  writes_->Start(4, 2);
  AwaitWrites(2000);
  ASSERT_OK_AND_ASSIGN(proto::SplitRangeReply r, Split("dense", 500));
  ASSERT_OK_AND_ASSIGN(proto::ClusterMap map,
                       AwaitMap(
                           "the range fenced for its split",
                           [](const proto::ClusterMap& m) {
                             const proto::RangeAssignment* a =
                                 RangeOf(m, "dense", 500);
                             return a != nullptr && a->split_at() == 500;
                           },
                           absl::Seconds(30)));
  const proto::RangeAssignment* a = RangeOf(map, "dense", 500);
  ASSERT_NO_FATAL_FAILURE(KillAndSettle(victim, *a));
  // And the range can be split afterwards (if the first split had not
  // finished before the kill).
  writes_->Start(4, 3);
  ASSERT_OK(SplitAndAwait(*sched_, "dense", 500, absl::Seconds(90)));
  AwaitWrites(2000);
  StopAndCheck("after splitting again");
}

INSTANTIATE_TEST_SUITE_P(Victims, KillDuringASplitTest,
                         ::testing::Values(Victim::kPrimary, Victim::kBackup,
                                           Victim::kScheduler),
                         VictimName);

TEST_F(SplitTest, NeighboursMergeWhileWritesGoOnAndBadMergesAreRefused) {
  // Two servers and two holders a range: every range on both servers.
  Start(2, {"--replicas=2", "--ranges_per_table=2", "--merge_min_age_s=0"});
  writes_->Start(4, 4);
  AwaitWrites(2000);
  // Split the dense table's first range, then merge it back; and merge
  // the sparse table's two ranges into one.
  ASSERT_OK(SplitAndAwait(*sched_, "dense", 700, absl::Seconds(90)));
  AwaitWrites(2000);
  // --merge_min_age_s=0 stands in for the boundary's age: the writers that
  // ran across the split stop (each of their writes answered) before the
  // merge, so that no write cut on a map without the boundary is retried
  // across it (docs/ARCHITECTURE.md, "Merging ranges").
  StopAndCheck("after the split");
  writes_->Start(4, 14);
  AwaitWrites(2000);
  ASSERT_OK(MergeAndAwait(*sched_, "dense", 700, absl::Seconds(90)));
  AwaitWrites(2000);
  ASSERT_OK_AND_ASSIGN(proto::ClusterMap before, sched_->GetClusterMap());
  ASSERT_EQ(TableNamed(before, "sparse")->ranges_size(), 2);
  const Key sparse_at = TableNamed(before, "sparse")->ranges(1).begin();
  ASSERT_OK(MergeAndAwait(*sched_, "sparse", sparse_at, absl::Seconds(90)));
  AwaitWrites(2000);
  ASSERT_OK_AND_ASSIGN(
      proto::ClusterMap map,
      AwaitMap(
          "quiet", [](const proto::ClusterMap& m) { return Settled(m, 2); },
          absl::Seconds(60)));
  EXPECT_EQ(TableNamed(map, "dense")->ranges_size(), 2);
  EXPECT_EQ(TableNamed(map, "dense")->ranges(0).end(), 1500u);
  EXPECT_EQ(TableNamed(map, "sparse")->ranges_size(), 1);
  StopAndCheck("after a split and two merges");

  // Bad merges: the last range, a key outside the key space, a table that
  // does not exist.
  absl::Status last = Merge("dense", 2999).status();
  EXPECT_EQ(last.code(), absl::StatusCode::kFailedPrecondition) << last;
  EXPECT_THAT(std::string(last.message()), ::testing::HasSubstr("last range"));
  EXPECT_EQ(Merge("dense", 3000).status().code(),
            absl::StatusCode::kOutOfRange);
  EXPECT_EQ(Merge("nope", 5).status().code(), absl::StatusCode::kNotFound);
}

// kill -9 while both neighbours are fenced for their merge (their
// primary reports them quiet a while late).
class KillDuringAMergeTest : public SplitTest,
                             public ::testing::WithParamInterface<Victim> {};

TEST_P(KillDuringAMergeTest, NothingIsLost) {
  const Victim victim = GetParam();
  // No balancing moves: the halves of the split stay on the same servers.
  Start(3,
        {"--replicas=2", "--ranges_per_table=2", "--merge_min_age_s=0",
         "--rebalance=false"},
        {"--inject_handover_delay_ms=1500"},
        /*durable=*/victim == Victim::kScheduler);
  writes_->Start(4, 5);
  AwaitWrites(2000);
  ASSERT_OK(SplitAndAwait(*sched_, "dense", 500, absl::Seconds(90)));
  // As above: no write cut before the split is retried across the merge.
  StopAndCheck("after the split");
  writes_->Start(4, 15);
  AwaitWrites(2000);
  ASSERT_OK(Merge("dense", 100).status());
  ASSERT_OK_AND_ASSIGN(
      proto::ClusterMap map,
      AwaitMap(
          "the neighbours fenced for their merge",
          [](const proto::ClusterMap& m) {
            const proto::RangeAssignment* a = RangeOf(m, "dense", 100);
            return a != nullptr &&
                   a->merge() == proto::RangeAssignment::MERGE_WITH_NEXT;
          },
          absl::Seconds(30)));
  const proto::RangeAssignment* a = RangeOf(map, "dense", 100);
  ASSERT_NO_FATAL_FAILURE(KillAndSettle(victim, *a));
  // And the neighbours merge afterwards (if the first merge had not
  // finished before the kill).
  writes_->Start(4, 6);
  ASSERT_OK(MergeAndAwait(*sched_, "dense", 500, absl::Seconds(90)));
  AwaitWrites(2000);
  StopAndCheck("after merging again");
}

INSTANTIATE_TEST_SUITE_P(Victims, KillDuringAMergeTest,
                         ::testing::Values(Victim::kPrimary, Victim::kBackup,
                                           Victim::kScheduler),
                         VictimName);

// Cold neighbours merge: with four ranges a table and writes to the
// first keys only, the scheduler merges the cold ranges (one pair at a
// time), never the hot one, and every write stays exact.
TEST_F(SplitTest, ColdNeighboursAreMergedByLoad) {
  Start(2, {"--balance=load", "--ranges_per_table=4", "--replicas=2",
            "--merge_min_age_s=0"});
  // Adds to the first 100 keys of the dense table, in batches, until the
  // scheduler has merged its three cold ranges into one (bounded: at most
  // 60 s).
  std::vector<Key> keys(100);
  for (Key k = 0; k < 100; ++k) keys[k] = k;
  std::vector<float> ones(keys.size() * tables_.width, 1.0f);
  const absl::Time deadline = absl::Now() + absl::Seconds(60);
  int ranges = 4;
  int adds = 0;
  while (ranges > 2 && absl::Now() < deadline) {
    for (int i = 0; i < 50; ++i, ++adds) {
      ASSERT_OK(client_->Wait(client_->Add(tables_.dense, Keys(keys), ones),
                              absl::Seconds(10)));
    }
    auto map = sched_->GetClusterMap();
    ASSERT_OK(map.status());
    ranges = TableNamed(*map, "dense")->ranges_size();
  }
  ASSERT_EQ(ranges, 2) << "the cold ranges were not merged within 60 s";
  auto map = sched_->GetClusterMap();
  ASSERT_OK(map.status());
  // The hot range [0, 750) stays as it was.
  EXPECT_EQ(RangeOf(*map, "dense", 0)->end(), 750u);
  EXPECT_EQ(RangeOf(*map, "dense", 750)->end(), 3000u);
  // Every add landed exactly once, through the merges.
  std::vector<float> got(keys.size() * tables_.width);
  ASSERT_OK(client_->Wait(
      client_->Pull(tables_.dense, Keys(keys), absl::MakeSpan(got)),
      absl::Seconds(10)));
  for (size_t i = 0; i < got.size(); ++i) {
    ASSERT_EQ(got[i], static_cast<float>(adds)) << "float " << i;
  }
}

// A bounded sparse table with a cold tier (rows evicted to the tier come
// back, so every sum stays exact): a range split in its middle and merged
// back while writes go on, then the primary of its holders killed. Each
// piece keeps its share of the table's cap (common/sparse_row_bytes.h) on
// every holder, and a cut far from the middle is refused.
TEST_F(SplitTest, ABoundedTableIsSplitAndMergedWithItsCap) {
  constexpr int64_t kCap = 200;  // of 500 keys: rows go to the tier always
  TableOptions::Bounds bounds;
  bounds.max_rows = kCap;
  bounds.eviction = "lru";
  bounds.cold_tier = true;
  sparse_bounds_ = bounds;
  Start(3, {"--replicas=2", "--merge_min_age_s=0"}, {}, /*durable=*/true);
  // Each server's cap: its ranges' shares of the key space.
  auto check_caps = [&](const std::string& when) {
    proto::ClusterMap map = Map();
    const proto::TableMap* t = TableNamed(map, "sparse");
    ASSERT_NE(t, nullptr);
    for (const proto::NodeInfo& n : map.nodes()) {
      if (n.role() != proto::SERVER || n.state() != proto::ALIVE) continue;
      uint64_t cap = 0;
      for (const proto::RangeAssignment& r : t->ranges()) {
        bool held = r.primary() == n.id();
        for (NodeId b : r.replicas()) held |= b == n.id();
        if (held) cap += KeySpaceShare(kCap, r.end() - r.begin(), kKeySpaceEnd);
      }
      ASSERT_OK_AND_ASSIGN(
          proto::ServerStats stats,
          ServerAdminClient(n.admin_address()).GetStats(absl::Seconds(10)));
      for (const proto::TableStats& ts : stats.tables()) {
        if (ts.name() != "sparse") continue;
        EXPECT_EQ(ts.row_cap(), cap) << when << ": " << n.name();
        EXPECT_LE(ts.rows(), ts.row_cap()) << when << ": " << n.name();
        EXPECT_GT(ts.cold_rows(), 0u) << when << ": " << n.name();
      }
    }
  };
  const proto::ClusterMap before = Map();
  const proto::RangeAssignment& r = TableNamed(before, "sparse")->ranges(1);
  const Key extent = r.end() - r.begin();
  const Key mid = r.begin() + extent / 2;
  // Writers (seeded `seed`) on while `change` splits or merges at `mid`;
  // then every row exact, the table in `ranges` ranges, the caps right.
  auto reshape = [&](uint64_t seed, const std::string& when,
                     const std::function<absl::Status()>& change, int ranges) {
    writes_->Start(4, seed);
    AwaitWrites(2000);
    ASSERT_OK(change());
    AwaitWrites(2000);
    ASSERT_NO_FATAL_FAILURE(Settle());
    StopAndCheck(when);
    EXPECT_EQ(TableNamed(Map(), "sparse")->ranges_size(), ranges);
    ASSERT_NO_FATAL_FAILURE(check_caps(when));
  };
  ASSERT_NO_FATAL_FAILURE(reshape(
      1, "after the split",
      [&] { return SplitAndAwait(*sched_, "sparse", mid, absl::Seconds(90)); },
      4));

  // A cut near a piece's end would leave a sliver of its cap.
  absl::Status uneven = Split("sparse", mid + (extent / 2) / 100).status();
  EXPECT_EQ(uneven.code(), absl::StatusCode::kFailedPrecondition) << uneven;
  EXPECT_THAT(std::string(uneven.message()), ::testing::HasSubstr("bounded"));

  // Writers that never crossed the split (see the merge tests above).
  ASSERT_NO_FATAL_FAILURE(reshape(
      2, "after the merge",
      [&] { return MergeAndAwait(*sched_, "sparse", mid, absl::Seconds(90)); },
      3));

  // Split again, then kill -9 the pieces' primary: its backup holds the
  // same rows, in memory and in its tier.
  writes_->Start(4, 3);
  ASSERT_OK(SplitAndAwait(*sched_, "sparse", mid, absl::Seconds(90)));
  AwaitWrites(2000);
  const proto::ClusterMap split = Map();
  const proto::RangeAssignment* piece = RangeOf(split, "sparse", mid);
  ASSERT_NE(piece, nullptr);
  ASSERT_NO_FATAL_FAILURE(KillAndSettle(Victim::kPrimary, *piece));
  ASSERT_NO_FATAL_FAILURE(check_caps("after the kill"));
}

// Load follows the keys: one server's range is hot at its first keys; the
// scheduler splits it at the median of its traffic and moves a half.
TEST_F(SplitTest, AHotRangeIsSplitByLoad) {
  Start(2, {"--balance=load", "--ranges_per_table=2", "--rebalance=true"});
  // Adds to the first 100 keys of the dense table, in batches, until the
  // scheduler has split the range (bounded: at most 60 s).
  std::vector<Key> keys(100);
  for (Key k = 0; k < 100; ++k) keys[k] = k;
  std::vector<float> ones(keys.size() * tables_.width, 1.0f);
  const absl::Time deadline = absl::Now() + absl::Seconds(60);
  bool split = false;
  while (!split && absl::Now() < deadline) {
    for (int i = 0; i < 50; ++i) {
      ASSERT_OK(client_->Wait(client_->Add(tables_.dense, Keys(keys), ones),
                              absl::Seconds(10)));
    }
    auto map = sched_->GetClusterMap();
    ASSERT_OK(map.status());
    split = TableNamed(*map, "dense")->ranges_size() > 2;
  }
  ASSERT_TRUE(split) << "the hot range was not split within 60 s";
  auto map = sched_->GetClusterMap();
  ASSERT_OK(map.status());
  const proto::RangeAssignment* first = RangeOf(*map, "dense", 0);
  std::cout << "split: first range now [" << first->begin() << ", "
            << first->end() << ")" << std::endl;
  // The median of keys 0..99 splits inside the first 100 keys.
  EXPECT_LE(first->end(), 100u);
}

}  // namespace
}  // namespace downpour
