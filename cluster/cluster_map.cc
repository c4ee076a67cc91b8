#include "cluster/cluster_map.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace downpour {

ClusterMapView::ClusterMapView(proto::ClusterMap map) : map_(std::move(map)) {
  for (int i = 0; i < map_.tables_size(); ++i) {
    table_by_name_[map_.tables(i).spec().name()] = i;
    table_by_id_[map_.tables(i).spec().id()] = i;
  }
  for (int i = 0; i < map_.nodes_size(); ++i) {
    const proto::NodeInfo& n = map_.nodes(i);
    node_by_id_[n.id()] = i;
    if (n.role() == proto::SERVER && n.state() == proto::ALIVE &&
        n.max_message_bytes() > 0 &&
        (min_server_message_ == 0 ||
         n.max_message_bytes() < min_server_message_)) {
      min_server_message_ = n.max_message_bytes();
    }
  }
}

absl::StatusOr<const proto::TableMap*> ClusterMapView::FindTable(
    const std::string& name) const {
  auto it = table_by_name_.find(name);
  if (it == table_by_name_.end()) {
    return absl::NotFoundError(absl::StrCat(
        "unknown table '", name, "' (cluster map epoch ", map_.epoch(), ")"));
  }
  return &map_.tables(it->second);
}

const proto::TableMap* ClusterMapView::FindTable(TableId id) const {
  auto it = table_by_id_.find(id);
  return it == table_by_id_.end() ? nullptr : &map_.tables(it->second);
}

const proto::NodeInfo* ClusterMapView::FindNode(NodeId id) const {
  auto it = node_by_id_.find(id);
  return it == node_by_id_.end() ? nullptr : &map_.nodes(it->second);
}

int ClusterMapView::RangeOf(const proto::TableMap& table, Key key) {
  const auto& ranges = table.ranges();
  // Ranges are sorted by begin: find the last range with begin <= key.
  auto it = std::upper_bound(
      ranges.begin(), ranges.end(), key,
      [](Key k, const proto::RangeAssignment& r) { return k < r.begin(); });
  if (it == ranges.begin()) return -1;
  --it;
  if (key >= it->end()) return -1;
  return static_cast<int>(it - ranges.begin());
}

}  // namespace downpour
