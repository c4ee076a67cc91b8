// Routing a key batch: which range (and so which server) each key goes to.
// A pure function over a table's range assignment (proto::TableMap), shared
// by the client's batch operations and its synced sparse pushes, and tested
// on its own.
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

// The keys of a batch that one range of the table holds.
struct OwnerGroup {
  int range = -1;                 // index into table.ranges()
  NodeId server = kNoNode;        // that range's primary
  std::vector<size_t> positions;  // into the batch, in the order given
};

struct SplitOptions {
  // Also an empty group for every range that holds none of the keys (a
  // synced push must reach every range, see client.h's
  // TableOptions::sync_workers).
  bool every_range = false;
};

// Groups `positions` (indices into `keys`) by the range of `table` that
// holds each key (table.ranges() sorted by begin, as the scheduler makes
// them): one group per range holding one of them (per range with
// every_range), in key-space order. kOutOfRange, naming the key, for the
// first key outside the table's key space. REQUIRES: every position <
// keys.size().
absl::StatusOr<std::vector<OwnerGroup>> SplitByOwner(
    const proto::TableMap& table, absl::Span<const Key> keys,
    absl::Span<const size_t> positions, const SplitOptions& options = {});

}  // namespace downpour

#endif  // DOWNPOUR_CLIENT_SPLIT_BY_OWNER_H_
