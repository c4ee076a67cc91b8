// Lookups over a cluster map: which server owns a key, where to reach it.
// Immutable after construction; thread-safe.
#ifndef DOWNPOUR_CLUSTER_CLUSTER_MAP_H_
#define DOWNPOUR_CLUSTER_CLUSTER_MAP_H_

#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "common/types.h"
#include "proto/downpour.pb.h"

namespace downpour {

class ClusterMapView {
 public:
  explicit ClusterMapView(proto::ClusterMap map);

  Epoch epoch() const { return map_.epoch(); }
  const proto::ClusterMap& proto() const { return map_; }

  // kNotFound when no table of that name exists.
  absl::StatusOr<const proto::TableMap*> FindTable(
      const std::string& name) const;
  const proto::TableMap* FindTable(TableId id) const;
  const proto::NodeInfo* FindNode(NodeId id) const;

  // Index into table.ranges() of the range holding `key`; -1 if none (the key
  // is outside the table's key space).
  static int RangeOf(const proto::TableMap& table, Key key);

  // The smallest request a live server accepts (NodeInfo.max_message_bytes);
  // 0 when no server says.
  uint64_t min_server_message_bytes() const { return min_server_message_; }

 private:
  proto::ClusterMap map_;
  absl::flat_hash_map<std::string, int> table_by_name_;
  absl::flat_hash_map<TableId, int> table_by_id_;
  absl::flat_hash_map<NodeId, int> node_by_id_;
  uint64_t min_server_message_ = 0;
};

}  // namespace downpour

#endif  // DOWNPOUR_CLUSTER_CLUSTER_MAP_H_
