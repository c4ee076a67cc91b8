#include "scheduler/capacity.h"

#include "common/test_util.h"
#include "scheduler/placement.h"

namespace downpour {
namespace {

using ::testing::HasSubstr;

proto::TableSpec Dense(const std::string& name, uint64_t keys, uint32_t width,
                       const std::string& handler = "sgd") {
  proto::TableSpec s;
  s.set_name(name);
  s.set_kind(proto::DENSE);
  s.set_width(width);
  s.set_num_keys(keys);
  s.mutable_handler()->set_name(handler);
  return s;
}

// Live servers 1..n, each with `limit` bytes of table memory (0: unknown).
proto::ClusterMap Servers(int n, uint64_t limit) {
  proto::ClusterMap map;
  for (int i = 1; i <= n; ++i) {
    proto::NodeInfo* node = map.add_nodes();
    node->set_id(i);
    node->set_role(proto::SERVER);
    node->set_state(proto::ALIVE);
    node->set_name("server-" + std::to_string(i - 1));
    node->set_memory_limit_bytes(limit);
  }
  return map;
}

proto::TableMap Placed(const proto::ClusterMap& map,
                       const proto::TableSpec& spec, int replicas) {
  proto::TableMap t;
  *t.mutable_spec() = spec;
  PlaceTable(&t, LiveServers(map), replicas);
  return t;
}

TEST(CapacityTest, RowBytesCountValuesVectorsAndState) {
  EXPECT_EQ(TableRowBytes(Dense("w", 10, 4)), 16u);
  EXPECT_EQ(TableRowBytes(Dense("w", 10, 4, "")), 16u);  // sgd
  EXPECT_EQ(TableRowBytes(Dense("w", 10, 4, "adagrad")), 32u);
  EXPECT_EQ(TableRowBytes(Dense("w", 10, 4, "adam")), 4u * (4 + 2 * 4 + 1));
  proto::TableSpec v = Dense("v", 10, 4);
  v.add_vectors("x");
  v.add_vectors("g");
  v.add_vectors("d");
  EXPECT_EQ(TableRowBytes(v), 3u * 16u);
  // Plugins' state is unknown here.
  EXPECT_EQ(TableRowBytes(Dense("p", 10, 4, "plugin:clipped_sgd")), 16u);
  EXPECT_EQ(RangeBytes(Dense("w", 10, 4), 2, 7), 5u * 16u);
  proto::TableSpec sparse = Dense("s", 0, 4);
  sparse.set_kind(proto::SPARSE);
  EXPECT_EQ(RangeBytes(sparse, 0, kKeySpaceEnd), 0u);
  // Saturates rather than wrapping.
  EXPECT_EQ(RangeBytes(Dense("huge", 0, 1u << 20, "adam"), 0, kKeySpaceEnd),
            std::numeric_limits<uint64_t>::max());
}

TEST(CapacityTest, RefusesATableAServerCannotHold) {
  // 2^40 keys of width 1 over two servers of 1 GiB: 2 TiB each.
  proto::ClusterMap map = Servers(2, uint64_t{1} << 30);
  proto::TableMap huge = Placed(map, Dense("huge", uint64_t{1} << 40, 1), 1);
  absl::Status s = CheckTableFits(map, huge);
  EXPECT_THAT(s, StatusIs(absl::StatusCode::kResourceExhausted));
  EXPECT_THAT(std::string(s.message()),
              HasSubstr("table 'huge' would need 2.0 TiB"));
  EXPECT_THAT(std::string(s.message()), HasSubstr("on server 1 ('server-0')"));
  EXPECT_THAT(std::string(s.message()),
              HasSubstr("1.0 GiB left of its table memory limit of 1.0 GiB"));

  // Just fits: 2 x 512 MiB of width 1 = 2^27 rows each.
  proto::TableMap fits = Placed(map, Dense("fits", uint64_t{1} << 28, 1), 1);
  EXPECT_OK(CheckTableFits(map, fits));
  *map.add_tables() = fits;
  EXPECT_EQ(CommittedBytes(map)[1], uint64_t{1} << 29);
  EXPECT_EQ(RoomLeft(map)[2], uint64_t{1} << 29);
  // The same again fits once more, a third time not.
  EXPECT_OK(
      CheckTableFits(map, Placed(map, Dense("b", uint64_t{1} << 28, 1), 1)));
  *map.add_tables() = Placed(map, Dense("b", uint64_t{1} << 28, 1), 1);
  EXPECT_THAT(CheckTableFits(map, Placed(map, Dense("c", 2, 1), 1)),
              StatusIs(absl::StatusCode::kResourceExhausted));
  // Sparse tables cost nothing at declaration.
  proto::TableSpec sparse = Dense("s", 0, 1024);
  sparse.set_kind(proto::SPARSE);
  EXPECT_OK(CheckTableFits(map, Placed(map, sparse, 2)));
}

TEST(CapacityTest, BackupsCountOnEveryHolder) {
  // 100 rows of 40 bytes over 2 servers with 2 replicas: each server holds
  // both ranges, 4000 bytes; a limit of 3999 refuses it.
  proto::ClusterMap map = Servers(2, 3999);
  proto::TableMap t = Placed(map, Dense("r", 100, 10), 2);
  EXPECT_THAT(CheckTableFits(map, t),
              StatusIs(absl::StatusCode::kResourceExhausted));
  EXPECT_OK(CheckTableFits(map, Placed(map, Dense("r", 100, 10), 1)));
  proto::ClusterMap roomy = Servers(2, 4000);
  EXPECT_OK(CheckTableFits(roomy, t));
  // Unknown limits are not checked.
  EXPECT_OK(CheckTableFits(Servers(2, 0),
                           Placed(map, Dense("x", uint64_t{1} << 40, 1), 2)));
}

TEST(CapacityTest, RefillOnlyChoosesServersWithRoom) {
  // Three servers; a table on servers 1 and 2 with replicas = 2; server 2
  // dies and a new backup is needed for both ranges.
  proto::ClusterMap map = Servers(3, 1000);
  map.mutable_nodes(2)->set_memory_limit_bytes(500);  // server 3
  proto::TableMap t;
  *t.mutable_spec() = Dense("t", 100, 2);  // 8 bytes a row
  PlaceTable(&t, {1, 2}, 2);               // 400 bytes per range
  *map.add_tables() = t;
  map.mutable_nodes(1)->set_state(proto::DEAD);
  RemoveServer(&map, 2);
  absl::flat_hash_map<NodeId, uint64_t> room = RoomLeft(map);
  EXPECT_EQ(room[3], 500u);
  ASSERT_TRUE(Refill(&map, 2, &room));
  // Server 3 had room for one range of 400 bytes, not two.
  int on_three = 0;
  for (const auto& r : map.tables(0).ranges()) {
    on_three += r.catching_up_size() == 1 && r.catching_up(0) == 3;
  }
  EXPECT_EQ(on_three, 1);
  EXPECT_EQ(room[3], 100u);
  // Excluded (server, table) pairs are never chosen.
  proto::ClusterMap again = Servers(3, 0);
  *again.add_tables() = t;
  again.mutable_nodes(1)->set_state(proto::DEAD);
  RemoveServer(&again, 2);
  absl::flat_hash_set<std::pair<NodeId, TableId>> excluded = {
      {3, t.spec().id()}};
  EXPECT_FALSE(Refill(&again, 2, nullptr, &excluded));
}

TEST(CapacityTest, ABoundedSparseTableCostsItsCap) {
  proto::ClusterMap map = Servers(2, 10 << 20);  // 10 MiB each
  proto::TableSpec spec;
  spec.set_name("emb");
  spec.set_kind(proto::SPARSE);
  spec.set_width(16);
  spec.mutable_handler()->set_name("adagrad");  // 16 floats of state
  // Unbounded: nothing at declaration.
  EXPECT_OK(CheckTableFits(map, Placed(map, spec, 1)));
  // 100k rows over 2 ranges: 50k rows of (32 floats + 32 bytes) = 8 MB a
  // server: fits in 10 MiB.
  spec.mutable_bounds()->set_max_rows(100000);
  const proto::TableMap placed = Placed(map, spec, 1);
  EXPECT_OK(CheckTableFits(map, placed));
  EXPECT_EQ(HeldBytes(placed, placed.ranges(0)), 50000u * (32 * 4 + 32));
  // With a backup each server holds both ranges: 16 MB > 10 MiB.
  absl::Status s = CheckTableFits(map, Placed(map, spec, 2));
  EXPECT_THAT(s, StatusIs(absl::StatusCode::kResourceExhausted));
  EXPECT_THAT(std::string(s.message()), HasSubstr("table 'emb'"));
  // max_bytes is the same cap in bytes.
  spec.mutable_bounds()->set_max_rows(0);
  spec.mutable_bounds()->set_max_bytes(int64_t{100000} * (32 * 4 + 32));
  EXPECT_EQ(HeldBytes(Placed(map, spec, 1), placed.ranges(0)),
            50000u * (32 * 4 + 32));
  // Committed once in the map: the room left shrinks.
  *map.add_tables() = placed;
  EXPECT_EQ(CommittedBytes(map).at(1), 50000u * (32 * 4 + 32));
}

}  // namespace
}  // namespace downpour
