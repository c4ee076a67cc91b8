#include "scheduler/placement.h"

#include <map>
#include <vector>

#include "common/test_util.h"

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

proto::TableMap* AddTable(proto::ClusterMap* map, uint64_t keys, int replicas) {
  proto::TableMap* t = map->add_tables();
  t->mutable_spec()->set_id(map->tables_size());
  t->mutable_spec()->set_kind(proto::DENSE);
  t->mutable_spec()->set_num_keys(keys);
  PlaceTable(t, LiveServers(*map), replicas);
  return t;
}

void Kill(proto::ClusterMap* map, NodeId id) {
  for (auto& n : *map->mutable_nodes()) {
    if (n.id() == id) n.set_state(proto::DEAD);
  }
}

std::vector<uint64_t> V(const google::protobuf::RepeatedField<uint64_t>& f) {
  return std::vector<uint64_t>(f.begin(), f.end());
}

TEST(PlacementTest, RangesGoRoundTheRingWithBackupsOnTheNextServers) {
  proto::ClusterMap map = MapWithServers(3);
  proto::TableMap* t = AddTable(&map, 300, 2);
  ASSERT_EQ(t->ranges_size(), 3);
  for (int i = 0; i < 3; ++i) {
    const auto& r = t->ranges(i);
    EXPECT_EQ(r.begin(), 100u * i);
    EXPECT_EQ(r.end(), 100u * (i + 1));
    EXPECT_EQ(r.primary(), static_cast<NodeId>(i + 1));
    EXPECT_EQ(V(r.replicas()), (std::vector<uint64_t>{(i + 1) % 3 + 1u}));
    EXPECT_TRUE(r.catching_up().empty());
  }
  // More holders than servers: every server once.
  proto::TableMap* wide = AddTable(&map, 2, 5);
  ASSERT_EQ(wide->ranges_size(), 2);  // fewer keys than servers
  EXPECT_EQ(wide->ranges(0).replicas_size(), 2);
}

TEST(PlacementTest, ADeadPrimaryIsReplacedByItsFirstInSyncBackup) {
  proto::ClusterMap map = MapWithServers(4);
  proto::TableMap* t = AddTable(&map, 400, 3);
  Kill(&map, 1);
  EXPECT_TRUE(RemoveServer(&map, 1));
  const auto& r0 = t->ranges(0);  // was 1 -> {2, 3}
  EXPECT_EQ(r0.primary(), 2u);
  // 3 may hold another prefix of 1's last writes: it starts over.
  EXPECT_TRUE(r0.replicas().empty());
  EXPECT_EQ(V(r0.catching_up()), (std::vector<uint64_t>{3}));
  // Where 1 was a backup it is gone; the primaries stay.
  const auto& r3 = t->ranges(3);  // 4 -> {1, 2}
  EXPECT_EQ(r3.primary(), 4u);
  EXPECT_EQ(V(r3.replicas()), (std::vector<uint64_t>{2}));
  EXPECT_FALSE(RemoveServer(&map, 1));  // nothing left to change

  // Back to three holders each, from the least loaded live servers.
  EXPECT_TRUE(Refill(&map, 3));
  for (const auto& r : t->ranges()) {
    EXPECT_EQ(1 + r.replicas_size() + r.catching_up_size(), 3) << r.begin();
    for (NodeId n : r.catching_up()) EXPECT_NE(n, 1u);
  }
  EXPECT_FALSE(Refill(&map, 3));
}

TEST(PlacementTest, WithoutAnInSyncBackupTheDeadPrimaryStays) {
  proto::ClusterMap map = MapWithServers(2);
  proto::TableMap* t = AddTable(&map, 10, 1);
  Kill(&map, 1);
  EXPECT_FALSE(RemoveServer(&map, 1));
  EXPECT_EQ(t->ranges(0).primary(), 1u);
  EXPECT_FALSE(t->ranges(0).lost());
  EXPECT_FALSE(Refill(&map, 2));  // no copy from a dead primary
  // A catching-up backup is not promoted either.
  proto::ClusterMap m2 = MapWithServers(2);
  proto::TableMap* t2 = AddTable(&m2, 10, 1);
  ASSERT_TRUE(Refill(&m2, 2));
  EXPECT_EQ(V(t2->ranges(0).catching_up()), (std::vector<uint64_t>{2}));
  Kill(&m2, 1);
  RemoveServer(&m2, 1);
  EXPECT_EQ(t2->ranges(0).primary(), 1u);
  // It comes back as a new process: what only it held is lost.
  EXPECT_TRUE(ForgetServerData(&map, 1));
  EXPECT_TRUE(t->ranges(0).lost());
  EXPECT_FALSE(ForgetServerData(&map, 1));
}

TEST(PlacementTest, ACatchingUpBackupIsInSyncOnlyWhenItsPrimarySaysSo) {
  proto::ClusterMap map = MapWithServers(2);
  proto::TableMap* t = AddTable(&map, 10, 1);
  ASSERT_TRUE(Refill(&map, 2));
  const TableId id = t->spec().id();
  EXPECT_THAT(
      MarkInSync(&map, id, 0, 2, 1),
      StatusIs(absl::StatusCode::kFailedPrecondition));  // wrong primary
  EXPECT_THAT(
      MarkInSync(&map, id, 5, 1, 2),
      StatusIs(absl::StatusCode::kFailedPrecondition));  // no such range
  const auto& r = t->ranges(0);
  ASSERT_EQ(r.primary(), 1u);
  const NodeId backup = r.catching_up(0);
  ASSERT_OK(MarkInSync(&map, id, 0, 1, backup));
  EXPECT_EQ(V(r.replicas()), (std::vector<uint64_t>{backup}));
  EXPECT_TRUE(r.catching_up().empty());
  EXPECT_THAT(MarkInSync(&map, id, 0, 1, backup),
              StatusIs(absl::StatusCode::kFailedPrecondition));  // already
}

}  // namespace
}  // namespace downpour

namespace downpour {
namespace {

TEST(PlacementTest, DropCatchingUpAndHoldsAnyRange) {
  proto::ClusterMap map = MapWithServers(3);
  proto::TableMap* t = AddTable(&map, 300, 2);
  const TableId id = t->spec().id();
  Kill(&map, 2);
  ASSERT_TRUE(RemoveServer(&map, 2));
  EXPECT_FALSE(HoldsAnyRange(map, 2));
  ASSERT_TRUE(Refill(&map, 2));
  // Server 3 catches up on [0, 100), whose backup server 2 was.
  bool catching = false;
  for (const auto& r : map.tables(0).ranges()) {
    for (NodeId n : r.catching_up()) catching |= n == 3;
  }
  ASSERT_TRUE(catching);
  EXPECT_FALSE(DropCatchingUp(&map, id + 1, 3));  // another table
  EXPECT_TRUE(DropCatchingUp(&map, id, 3));
  for (const auto& r : map.tables(0).ranges()) {
    for (NodeId n : r.catching_up()) EXPECT_NE(n, 3u);
  }
  EXPECT_FALSE(DropCatchingUp(&map, id, 3));
  EXPECT_TRUE(HoldsAnyRange(map, 3));  // still the primary of [200, 300)
  EXPECT_TRUE(HoldsAnyRange(map, 1));
}

void Revive(proto::ClusterMap* map, NodeId id) {
  for (auto& n : *map->mutable_nodes()) {
    if (n.id() == id) n.set_state(proto::ALIVE);
  }
}

// A server killed and restarted: the survivor is primary of everything,
// the returned server catches up on both ranges, and once a range's copy
// is in sync it is handed back, one range each in the end.
TEST(PlacementTest, PrimariesAreBalancedByHandingRangesToInSyncBackups) {
  proto::ClusterMap map = MapWithServers(2);
  proto::TableMap* t = AddTable(&map, 200, 2);
  const TableId id = t->spec().id();
  EXPECT_FALSE(BalancePrimaries(&map));  // placed balanced
  Kill(&map, 2);
  ASSERT_TRUE(RemoveServer(&map, 2));
  Revive(&map, 2);
  ASSERT_TRUE(Refill(&map, 2));
  EXPECT_EQ(t->ranges(0).primary(), 1u);
  EXPECT_EQ(t->ranges(1).primary(), 1u);
  // Catching up is not enough: only an in-sync backup can take a range.
  EXPECT_FALSE(BalancePrimaries(&map));
  ASSERT_OK(MarkInSync(&map, id, 100, 1, 2));
  EXPECT_TRUE(BalancePrimaries(&map));
  EXPECT_EQ(t->ranges(0).handing_to(), kNoNode);
  EXPECT_EQ(t->ranges(1).handing_to(), 2u);
  EXPECT_TRUE(HandOversUnderWay(map));
  ASSERT_OK(MarkInSync(&map, id, 0, 1, 2));
  // The handover under way counts at its target already: one each.
  EXPECT_FALSE(BalancePrimaries(&map));
  EXPECT_THAT(HandOver(&map, id, 100, 2, 1),  // not the primary
              StatusIs(absl::StatusCode::kFailedPrecondition));
  EXPECT_THAT(HandOver(&map, id, 0, 1, 2),  // no handover there
              StatusIs(absl::StatusCode::kFailedPrecondition));
  ASSERT_OK(HandOver(&map, id, 100, 1, 2));
  EXPECT_EQ(t->ranges(1).primary(), 2u);
  EXPECT_EQ(V(t->ranges(1).replicas()), (std::vector<uint64_t>{1}));
  EXPECT_EQ(t->ranges(1).handing_to(), kNoNode);
  EXPECT_FALSE(HandOversUnderWay(map));
  EXPECT_FALSE(BalancePrimaries(&map));
  EXPECT_THAT(HandOver(&map, id, 100, 1, 2),  // done already
              StatusIs(absl::StatusCode::kFailedPrecondition));
}

// Three servers, six ranges all on server 1 with in-sync backups on the
// others: two handed to each of them.
TEST(PlacementTest, BalancingSpreadsPrimariesOverEveryLiveServer) {
  proto::ClusterMap map = MapWithServers(3);
  proto::TableMap* t = map.add_tables();
  t->mutable_spec()->set_id(1);
  for (int i = 0; i < 6; ++i) {
    proto::RangeAssignment* r = t->add_ranges();
    r->set_begin(10 * i);
    r->set_end(10 * i + 10);
    r->set_primary(1);
    r->add_replicas(2 + i % 2);
    r->add_replicas(3 - i % 2);
  }
  EXPECT_TRUE(BalancePrimaries(&map));
  std::map<NodeId, int> owners;
  for (const auto& r : t->ranges()) {
    ++owners[r.handing_to() != kNoNode ? r.handing_to() : r.primary()];
  }
  EXPECT_EQ(owners, (std::map<NodeId, int>{{1, 2}, {2, 2}, {3, 2}}));
}

// A handover stands only while both ends are alive and the target in
// sync; the scheduler can also cancel them all (a primary never reported).
TEST(PlacementTest, AHandoverIsCancelledWhenEitherEndGoes) {
  proto::ClusterMap map = MapWithServers(3);
  proto::TableMap* t = AddTable(&map, 300, 3);
  t->mutable_ranges(0)->set_handing_to(2);
  t->mutable_ranges(1)->set_handing_to(3);
  t->mutable_ranges(2)->set_handing_to(1);
  // Server 2 dies: the handover to it is cancelled, and the one from it
  // (range 1) ends with its first in-sync backup (3) promoted.
  Kill(&map, 2);
  ASSERT_TRUE(RemoveServer(&map, 2));
  EXPECT_EQ(t->ranges(0).handing_to(), kNoNode);
  EXPECT_EQ(t->ranges(1).handing_to(), kNoNode);
  EXPECT_EQ(t->ranges(1).primary(), 3u);
  EXPECT_EQ(t->ranges(2).handing_to(), 1u);
  // Server 1 comes back as a new process: its handover target is gone.
  ASSERT_TRUE(ForgetServerData(&map, 1));
  EXPECT_EQ(t->ranges(2).handing_to(), kNoNode);
  t->mutable_ranges(2)->set_handing_to(3);
  EXPECT_TRUE(HandOversUnderWay(map));
  EXPECT_TRUE(CancelHandOvers(&map));
  EXPECT_FALSE(HandOversUnderWay(map));
  EXPECT_FALSE(CancelHandOvers(&map));
}

}  // namespace
}  // namespace downpour
