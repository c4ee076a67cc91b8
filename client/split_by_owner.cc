#include "client/split_by_owner.h"

#include "absl/strings/str_cat.h"
#include "cluster/cluster_map.h"

namespace downpour {

absl::StatusOr<std::vector<OwnerGroup>> SplitByOwner(
    const proto::TableMap& table, absl::Span<const Key> keys,
    absl::Span<const size_t> positions, const SplitOptions& options) {
  // The group of each range: by range, its own; by server, the one of the
  // server's first range.
  const int num_ranges = table.ranges_size();
  std::vector<OwnerGroup> groups;
  std::vector<size_t> group_of(num_ranges);
  for (int r = 0; r < num_ranges; ++r) {
    const NodeId server = table.ranges(r).primary();
    size_t g = groups.size();
    if (options.by_server) {
      for (size_t i = 0; i < groups.size(); ++i) {
        if (groups[i].server == server) g = i;
      }
    }
    if (g == groups.size()) groups.push_back(OwnerGroup{server, {}});
    group_of[r] = g;
  }
  for (size_t p : positions) {
    const int r = ClusterMapView::RangeOf(table, keys[p]);
    if (r < 0) {
      return absl::OutOfRangeError(
          absl::StrCat("key ", keys[p], " is outside the table's key space"));
    }
    groups[group_of[r]].positions.push_back(p);
  }
  const bool keep_empty = options.by_server && options.every_server;
  if (!keep_empty) {
    std::vector<OwnerGroup> used;
    for (OwnerGroup& g : groups) {
      if (!g.positions.empty()) used.push_back(std::move(g));
    }
    groups = std::move(used);
  }
  return groups;
}

}  // namespace downpour
