#include "scheduler/moves.h"

#include <iostream>
#include <map>
#include <vector>

#include "common/test_util.h"
#include "scheduler/placement.h"

namespace downpour {
namespace {

proto::ClusterMap MapWithServers(int n) {
  proto::ClusterMap map;
  for (int i = 1; i <= n; ++i) {
    proto::NodeInfo* node = map.add_nodes();
    node->set_id(i);
    node->set_role(proto::SERVER);
    node->set_state(proto::ALIVE);
  }
  return map;
}

void AddServer(proto::ClusterMap* map) {
  proto::NodeInfo* node = map->add_nodes();
  node->set_id(map->nodes_size());
  node->set_role(proto::SERVER);
  node->set_state(proto::ALIVE);
}

proto::NodeInfo* Node(proto::ClusterMap* map, NodeId id) {
  for (auto& n : *map->mutable_nodes()) {
    if (n.id() == id) return &n;
  }
  return nullptr;
}

// A dense table of `ranges` ranges of 100 keys of width 1 (400 bytes each).
proto::TableMap* AddTable(proto::ClusterMap* map, int ranges, int replicas) {
  proto::TableMap* t = map->add_tables();
  t->mutable_spec()->set_id(map->tables_size());
  t->mutable_spec()->set_kind(proto::DENSE);
  t->mutable_spec()->set_width(1);
  t->mutable_spec()->set_num_keys(100 * ranges);
  PlaceTable(t, LiveServers(*map), replicas, ranges);
  return t;
}

bool Has(const google::protobuf::RepeatedField<uint64_t>& f, NodeId id) {
  return std::find(f.begin(), f.end(), id) != f.end();
}

bool Holds(const proto::RangeAssignment& r, NodeId id) {
  return r.primary() == id || Has(r.replicas(), id) || Has(r.catching_up(), id);
}

// Every range has a live primary and `in_sync - 1` in-sync backups at
// least: what r holders throughout means.
void ExpectInSync(const proto::ClusterMap& map, int in_sync,
                  const std::string& when) {
  for (const auto& t : map.tables()) {
    for (const auto& r : t.ranges()) {
      EXPECT_GE(1 + r.replicas_size(), in_sync)
          << when << ": range " << r.begin() << " " << r.DebugString();
    }
  }
}

// Plays the servers: each catching-up backup is reported in sync, each
// handover reported done, and the scheduler's rules applied after each
// report (as TableRegistry::ReplicaReady does), until nothing moves.
// Checks `in_sync` holders after every step. Returns the steps taken.
int Drive(proto::ClusterMap* map, const MoveOptions& o, int in_sync) {
  int steps = 0;
  StartMoves(map, o);
  SettleMoves(map, o.replicas);
  for (bool progress = true; progress && steps < 1000;) {
    progress = false;
    for (auto& t : *map->mutable_tables()) {
      for (auto& r : *t.mutable_ranges()) {
        if (r.handing_to() != kNoNode) {
          EXPECT_OK(HandOver(map, t.spec().id(), r.begin(), r.primary(),
                             r.handing_to()));
        } else if (r.catching_up_size() > 0) {
          EXPECT_OK(MarkInSync(map, t.spec().id(), r.begin(), r.primary(),
                               r.catching_up(0)));
        } else {
          continue;
        }
        ++steps;
        progress = true;
        SettleMoves(map, o.replicas);
        StartMoves(map, o);
        SettleMoves(map, o.replicas);
        ExpectInSync(*map, in_sync, absl::StrCat("step ", steps));
        EXPECT_LE(MovesUnderWay(*map), o.max_moves);
      }
    }
  }
  return steps;
}

std::map<NodeId, int> Held(const proto::ClusterMap& map) {
  std::map<NodeId, int> out;
  for (NodeId s : LiveServers(map)) out[s] = RangesHeld(map, s);
  return out;
}

TEST(MovesTest, AServerThatJoinsTakesItsShare) {
  proto::ClusterMap map = MapWithServers(2);
  AddTable(&map, 8, 1);
  MoveOptions o;
  EXPECT_FALSE(StartMoves(&map, o));  // balanced: nothing moves
  AddServer(&map);
  Drive(&map, o, 1);
  EXPECT_EQ(MovesUnderWay(map), 0);
  std::map<NodeId, int> held = Held(map);
  EXPECT_EQ(held[3], 2) << map.DebugString();
  EXPECT_EQ(held[1] + held[2], 6);
  EXPECT_LE(std::abs(held[1] - held[2]), 1);
  // A fourth: 2 each.
  AddServer(&map);
  Drive(&map, o, 1);
  EXPECT_EQ(Held(map), (std::map<NodeId, int>{{1, 2}, {2, 2}, {3, 2}, {4, 2}}));
  EXPECT_FALSE(StartMoves(&map, o));
}

TEST(MovesTest, ScaleOutKeepsRHoldersThroughout) {
  proto::ClusterMap map = MapWithServers(3);
  AddTable(&map, 6, 2);
  MoveOptions o;
  o.replicas = 2;
  AddServer(&map);
  Drive(&map, o, 2);
  EXPECT_EQ(Held(map), (std::map<NodeId, int>{{1, 3}, {2, 3}, {3, 3}, {4, 3}}));
  for (const auto& r : map.tables(0).ranges()) {
    EXPECT_EQ(r.replicas_size(), 1);
    EXPECT_EQ(r.catching_up_size(), 0);
  }
}

TEST(MovesTest, AMoveOfAPrimaryEndsWithAHandover) {
  proto::ClusterMap map = MapWithServers(1);
  proto::TableMap* t = AddTable(&map, 2, 1);
  AddServer(&map);
  MoveOptions o;
  ASSERT_TRUE(StartMoves(&map, o));
  ASSERT_EQ(MovesUnderWay(map), 1);
  const int i = t->ranges(0).move_to() != kNoNode ? 0 : 1;
  proto::RangeAssignment* r = t->mutable_ranges(i);
  EXPECT_EQ(r->move_from(), 1u);
  EXPECT_EQ(r->move_to(), 2u);
  EXPECT_TRUE(Has(r->catching_up(), 2));
  EXPECT_FALSE(SettleMoves(&map, o.replicas));  // still copying
  ASSERT_OK(MarkInSync(&map, t->spec().id(), r->begin(), 1, 2));
  EXPECT_TRUE(SettleMoves(&map, o.replicas));
  EXPECT_EQ(r->handing_to(), 2u);  // 1 stops writing, then reports
  ASSERT_OK(HandOver(&map, t->spec().id(), r->begin(), 1, 2));
  EXPECT_TRUE(SettleMoves(&map, o.replicas));
  EXPECT_EQ(r->primary(), 2u);
  EXPECT_TRUE(r->replicas().empty());  // 1 left the range
  EXPECT_EQ(r->move_to(), kNoNode);
}

TEST(MovesTest, ADrainedServerGivesEveryRangeAway) {
  proto::ClusterMap map = MapWithServers(3);
  AddTable(&map, 6, 2);
  AddTable(&map, 3, 2);
  MoveOptions o;
  o.replicas = 2;
  o.max_moves = 1;
  ASSERT_OK(CheckDrainable(map, 2, 2));
  Node(&map, 2)->set_draining(true);
  EXPECT_GT(Drive(&map, o, 2), 0);
  EXPECT_EQ(RangesHeld(map, 2), 0);
  for (const auto& t : map.tables()) {
    for (const auto& r : t.ranges()) {
      EXPECT_EQ(1 + r.replicas_size(), 2);
      EXPECT_FALSE(Holds(r, 2));
    }
  }
  // Two servers left for two holders each: no further drain.
  EXPECT_EQ(CheckDrainable(map, 1, 2).code(),
            absl::StatusCode::kFailedPrecondition);
}

TEST(MovesTest, TheLastServerCannotBeDrained) {
  proto::ClusterMap map = MapWithServers(1);
  AddTable(&map, 4, 1);
  absl::Status s = CheckDrainable(map, 1, 1);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(s.message()), ::testing::HasSubstr("add a server"));
  AddServer(&map);
  EXPECT_OK(CheckDrainable(map, 1, 1));
}

TEST(MovesTest, AMoveWhoseTargetDiesIsCancelled) {
  proto::ClusterMap map = MapWithServers(2);
  proto::TableMap* t = AddTable(&map, 4, 1);
  AddServer(&map);
  MoveOptions o;
  o.max_moves = 1;
  ASSERT_TRUE(StartMoves(&map, o));
  int i = 0;
  while (t->ranges(i).move_to() == kNoNode) ++i;
  const NodeId from = t->ranges(i).move_from();
  // Killed while copying: the old primary keeps the range.
  Node(&map, 3)->set_state(proto::DEAD);
  RemoveServer(&map, 3);
  EXPECT_TRUE(SettleMoves(&map, o.replicas));
  EXPECT_EQ(t->ranges(i).primary(), from);
  EXPECT_EQ(t->ranges(i).move_to(), kNoNode);
  EXPECT_FALSE(Holds(t->ranges(i), 3));
  EXPECT_EQ(MovesUnderWay(map), 0);

  // Killed once in sync, while its handover is under way: the same.
  Node(&map, 3)->set_state(proto::ALIVE);
  ASSERT_TRUE(StartMoves(&map, o));
  i = 0;
  while (t->ranges(i).move_to() == kNoNode) ++i;
  proto::RangeAssignment* r = t->mutable_ranges(i);
  ASSERT_OK(MarkInSync(&map, t->spec().id(), r->begin(), r->primary(), 3));
  SettleMoves(&map, o.replicas);
  ASSERT_EQ(r->handing_to(), 3u);
  Node(&map, 3)->set_state(proto::DEAD);
  RemoveServer(&map, 3);
  SettleMoves(&map, o.replicas);
  EXPECT_EQ(r->handing_to(), kNoNode);
  EXPECT_EQ(r->move_to(), kNoNode);
  EXPECT_FALSE(Holds(*r, 3));
  EXPECT_NE(r->primary(), 3u);
}

TEST(MovesTest, AMoveWhoseSourceDiesLeavesTheTargetAsABackup) {
  proto::ClusterMap map = MapWithServers(3);
  proto::TableMap* t = AddTable(&map, 6, 2);
  MoveOptions o;
  o.replicas = 2;
  o.max_moves = 1;
  AddServer(&map);
  ASSERT_TRUE(StartMoves(&map, o));
  int i = 0;
  while (t->ranges(i).move_to() == kNoNode) ++i;
  proto::RangeAssignment* r = t->mutable_ranges(i);
  const NodeId from = r->move_from();
  Node(&map, from)->set_state(proto::DEAD);
  RemoveServer(&map, from);
  SettleMoves(&map, o.replicas);
  EXPECT_EQ(r->move_to(), kNoNode);
  EXPECT_TRUE(Has(r->catching_up(), 4));  // still copied to: a backup
  EXPECT_NE(r->primary(), from);
  EXPECT_FALSE(Holds(*r, from));
}

// The race tests/elastic_test.cc found: a range that lost a holder (its
// other holder died) must not start a move (a refill comes first), and a
// move whose range lost a holder meanwhile keeps its source: a move never
// leaves a range with fewer than r holders.
TEST(MovesTest, NoMoveLeavesARangeShortOfHolders) {
  proto::ClusterMap map = MapWithServers(3);
  proto::TableMap* t = AddTable(&map, 3, 2);
  MoveOptions o;
  o.replicas = 2;
  o.max_moves = 1;
  // Range 0 (1 -> {2}) loses 2: one holder left, nothing may move it.
  Node(&map, 2)->set_state(proto::DEAD);
  RemoveServer(&map, 2);
  AddServer(&map);  // 4: empty, so that something wants to move
  StartMoves(&map, o);
  EXPECT_EQ(t->ranges(0).move_to(), kNoNode) << t->ranges(0).DebugString();
  // A move under way whose range loses a holder: its source stays.
  Node(&map, 2)->set_state(proto::ALIVE);
  proto::ClusterMap again = MapWithServers(3);
  proto::TableMap* u = AddTable(&again, 3, 2);
  AddServer(&again);
  ASSERT_TRUE(StartMoves(&again, o)) << again.DebugString();
  int i = 0;
  while (u->ranges(i).move_to() == kNoNode) ++i;
  proto::RangeAssignment* r = u->mutable_ranges(i);
  const NodeId from = r->move_from(), to = r->move_to();
  // The other holder of the range dies.
  NodeId other = r->primary() == from ? r->replicas(0) : r->primary();
  Node(&again, other)->set_state(proto::DEAD);
  RemoveServer(&again, other);
  SettleMoves(&again, o.replicas);
  ASSERT_OK(MarkInSync(&again, u->spec().id(), r->begin(), r->primary(), to));
  SettleMoves(&again, o.replicas);
  if (r->handing_to() != kNoNode) {
    ASSERT_OK(HandOver(&again, u->spec().id(), r->begin(), r->primary(),
                       r->handing_to()));
    SettleMoves(&again, o.replicas);
  }
  EXPECT_EQ(r->move_to(), kNoNode);
  EXPECT_TRUE(Holds(*r, from)) << r->DebugString();
  EXPECT_TRUE(Holds(*r, to));
  EXPECT_EQ(1 + r->replicas_size() + r->catching_up_size(), 2);
}

TEST(MovesTest, CallingADrainOffUndoesItsMovesUnderWay) {
  proto::ClusterMap map = MapWithServers(2);
  proto::TableMap* t = AddTable(&map, 4, 1);
  Node(&map, 1)->set_draining(true);
  MoveOptions o;
  o.max_moves = 1;
  ASSERT_TRUE(StartMoves(&map, o));
  ASSERT_EQ(MovesFrom(map, 1), 1);
  Node(&map, 1)->set_draining(false);
  EXPECT_TRUE(CancelMovesFrom(&map, 1));
  EXPECT_EQ(MovesUnderWay(map), 0);
  for (const auto& r : t->ranges()) {
    EXPECT_EQ(r.catching_up_size(), 0);
    EXPECT_EQ(r.replicas_size(), 0);
  }
}

TEST(MovesTest, NoServerGetsARangeItHasNoRoomFor) {
  proto::ClusterMap map = MapWithServers(2);
  AddTable(&map, 8, 1);
  AddServer(&map);
  absl::flat_hash_map<NodeId, uint64_t> room = {{3, 500}};  // one range
  MoveOptions o;
  o.max_moves = 4;
  ASSERT_TRUE(StartMoves(&map, o, &room));
  EXPECT_EQ(MovesUnderWay(map), 1);
  EXPECT_EQ(room[3], 100u);
}

TEST(MovesTest, SparseRangesWeighAsReported) {
  proto::ClusterMap map = MapWithServers(2);
  proto::TableMap* t = map.add_tables();
  t->mutable_spec()->set_id(1);
  t->mutable_spec()->set_kind(proto::SPARSE);
  t->mutable_spec()->set_width(1);
  PlaceTable(t, LiveServers(map), 1, 4);  // 1: 0, 2; 2: 1, 3
  RangeSizes sizes;
  sizes[{1, t->ranges(0).begin()}] = 1000;
  sizes[{1, t->ranges(2).begin()}] = 1000;
  sizes[{1, t->ranges(1).begin()}] = 10;
  sizes[{1, t->ranges(3).begin()}] = 10;
  AddServer(&map);
  MoveOptions o;
  o.max_moves = 4;
  ASSERT_TRUE(StartMoves(&map, o, nullptr, nullptr, &sizes));
  // Server 1 holds 2000 bytes, the others 20 and 0: one big range moves.
  ASSERT_EQ(MovesUnderWay(map), 1);
  EXPECT_EQ(MovesFrom(map, 1), 1);
}

// Load follows the keys: with skewed loads, the busiest server gives hot
// ranges to the least busy until none is more than the tolerance above the
// mean (as far as whole ranges allow).
TEST(MovesTest, UnderLoadBalancingHotRangesSpreadOut) {
  proto::ClusterMap map = MapWithServers(4);
  proto::TableMap* t = map.add_tables();
  t->mutable_spec()->set_id(1);
  t->mutable_spec()->set_kind(proto::SPARSE);
  t->mutable_spec()->set_width(1);
  PlaceTable(t, LiveServers(map), 1, 32);  // 8 ranges per server
  // Zipf-like: range i has load 1000 / (i + 1); the hottest all on server
  // 1 and 2 at first (ranges 0, 4, 8, ... on server 1).
  RangeSizes load;
  for (int i = 0; i < t->ranges_size(); ++i) {
    load[{1, t->ranges(i).begin()}] = 1000 / (i + 1) + 1;
  }
  auto server_load = [&](NodeId s) {
    uint64_t sum = 0;
    for (const auto& r : t->ranges()) {
      if (r.primary() == s) sum += load[{1, r.begin()}];
    }
    return sum;
  };
  auto imbalance = [&] {
    uint64_t total = 0, most = 0;
    for (NodeId s = 1; s <= 4; ++s) {
      total += server_load(s);
      most = std::max(most, server_load(s));
    }
    return static_cast<double>(most) / (total / 4.0);
  };
  const double before = imbalance();
  MoveOptions o;
  o.by = MoveOptions::Balance::kLoad;
  o.max_moves = 1;
  for (int step = 0; step < 100; ++step) {
    if (!StartMoves(&map, o, nullptr, nullptr, &load)) break;
    for (auto& r : *t->mutable_ranges()) {
      if (r.move_to() == kNoNode) continue;
      ASSERT_OK(MarkInSync(&map, 1, r.begin(), r.primary(), r.move_to()));
      SettleMoves(&map, o.replicas);
      ASSERT_OK(HandOver(&map, 1, r.begin(), r.primary(), r.handing_to()));
      SettleMoves(&map, o.replicas);
    }
  }
  EXPECT_EQ(MovesUnderWay(map), 0);
  std::cout << "busiest server's load / mean: " << before << " -> "
            << imbalance() << std::endl;
  EXPECT_GT(before, 1.3);
  EXPECT_LE(imbalance(), 1.1 + 1e-9);
  // Within the tolerance: nothing moves.
  EXPECT_FALSE(StartMoves(&map, o, nullptr, nullptr, &load));
}

}  // namespace
}  // namespace downpour
