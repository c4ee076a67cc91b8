// Routing a key batch: which server each key goes to. A pure function over
// a table's range assignment (proto::TableMap), shared by the client's
// batch operations and its synced sparse pushes, and tested on its own.
//
//   DP_ASSIGN_OR_RETURN(std::vector<OwnerGroup> groups,
//                       SplitByOwner(table, keys, positions));
//   for (const OwnerGroup& g : groups) ... send keys[g.positions] to g.server
//
// Thread-safe: no state.
#ifndef DOWNPOUR_CLIENT_SPLIT_BY_OWNER_H_
#define DOWNPOUR_CLIENT_SPLIT_BY_OWNER_H_

#include <cstddef>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "common/types.h"
#include "proto/downpour.pb.h"

namespace downpour {

// The keys of a batch that one owner holds.
struct OwnerGroup {
  NodeId server = kNoNode;        // the primary of the range(s)
  std::vector<size_t> positions;  // into the batch, in the order given
};

struct SplitOptions {
  // false: one group per range of the table that holds a key, in key-space
  // order. true: one group per server, its ranges merged, in the order of
  // each server's first range.
  bool by_server = false;
  // With by_server: also a group, empty, for every server that owns a range
  // of the table but none of the keys (a synced push must reach every
  // server, see client.h's TableOptions::sync_workers).
  bool every_server = false;
};

// Groups `positions` (indices into `keys`) by the owner of each key in
// `table` (table.ranges() sorted by begin, as the scheduler makes them).
// Groups without a position are left out unless every_server asks for
// them. kOutOfRange, naming the key, for the first key outside the
// table's key space. REQUIRES: every position < keys.size().
absl::StatusOr<std::vector<OwnerGroup>> SplitByOwner(
    const proto::TableMap& table, absl::Span<const Key> keys,
    absl::Span<const size_t> positions, const SplitOptions& options = {});

}  // namespace downpour

#endif  // DOWNPOUR_CLIENT_SPLIT_BY_OWNER_H_
