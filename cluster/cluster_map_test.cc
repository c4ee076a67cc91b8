#include "cluster/cluster_map.h"

#include "common/test_util.h"

namespace downpour {
namespace {

TEST(ClusterMapViewTest, FindsOwnerOfKeys) {
  proto::ClusterMap map;
  map.set_epoch(4);
  proto::TableMap* t = map.add_tables();
  t->mutable_spec()->set_name("w");
  t->mutable_spec()->set_id(3);
  for (auto [b, e, p] :
       {std::tuple<Key, Key, NodeId>{0, 10, 1}, {10, 20, 2}, {20, 25, 3}}) {
    proto::RangeAssignment* r = t->add_ranges();
    r->set_begin(b);
    r->set_end(e);
    r->set_primary(p);
  }
  map.add_nodes()->set_id(2);
  ClusterMapView view(map);
  auto table = view.FindTable("w");
  ASSERT_OK(table);
  EXPECT_EQ(view.FindTable(3), *table);
  EXPECT_EQ(view.FindTable(4), nullptr);
  EXPECT_THAT(view.FindTable("nope"), StatusIs(absl::StatusCode::kNotFound));
  EXPECT_EQ(ClusterMapView::RangeOf(**table, 0), 0);
  EXPECT_EQ(ClusterMapView::RangeOf(**table, 9), 0);
  EXPECT_EQ(ClusterMapView::RangeOf(**table, 10), 1);
  EXPECT_EQ(ClusterMapView::RangeOf(**table, 24), 2);
  EXPECT_EQ(ClusterMapView::RangeOf(**table, 25), -1);
  ASSERT_NE(view.FindNode(2), nullptr);
  EXPECT_EQ(view.FindNode(1), nullptr);
}

}  // namespace
}  // namespace downpour
