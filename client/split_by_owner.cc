#include "client/split_by_owner.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "cluster/cluster_map.h"

namespace downpour {

absl::StatusOr<std::vector<OwnerGroup>> SplitByOwner(
    const proto::TableMap& table, absl::Span<const Key> keys,
    absl::Span<const size_t> positions, const SplitOptions& options) {
  std::vector<OwnerGroup> groups(table.ranges_size());
  for (int r = 0; r < table.ranges_size(); ++r) {
    groups[r].range = r;
    groups[r].server = table.ranges(r).primary();
  }
  for (size_t p : positions) {
    const int r = ClusterMapView::RangeOf(table, keys[p]);
    if (r < 0) {
      return absl::OutOfRangeError(
          absl::StrCat("key ", keys[p], " is outside the table's key space"));
    }
    groups[r].positions.push_back(p);
  }
  if (!options.every_range) {
    std::vector<OwnerGroup> used;
    for (OwnerGroup& g : groups) {
      if (!g.positions.empty()) used.push_back(std::move(g));
    }
    groups = std::move(used);
  }
  return groups;
}

}  // namespace downpour
