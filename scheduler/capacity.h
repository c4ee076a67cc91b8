// What tables cost the servers that hold them, against the table memory
// each server reported at registration (NodeInfo.memory_limit_bytes): the
// scheduler refuses a table before it enters the map if any server's share
// would not fit, and never makes a server a backup of a range it has no
// room for. Pure functions over the cluster map; thread-safe.
//
//   proto::TableMap placed = ...;   // PlaceTable on a copy, not yet in the map
//   DP_RETURN_IF_ERROR(CheckTableFits(map, placed));
//
// A server holds, for every range it is primary or backup of (in sync or
// catching up), rows x (width x vectors + handler state) floats: the
// dense arrays a server allocates for the range (the values at once,
// handler state and named vectors on first use, all counted from the
// start). A bounded sparse table (TableSpec.bounds with a row cap) costs
// its cap: each range its share of the key space of the cap, in rows of
// SparseRowBytes (common/sparse_row_bytes.h). Other sparse tables hold only the
// rows written, so they cost nothing at declaration; their growth is not
// checked here. Plugin handlers' state
// is unknown to the scheduler (it loads no plugins) and counted as 0; the
// server counts it exactly and refuses what it cannot hold (reported
// through AckEpoch). Arithmetic saturates at UINT64_MAX, so a 2^64-key
// table is never "small".
#ifndef DOWNPOUR_SCHEDULER_CAPACITY_H_
#define DOWNPOUR_SCHEDULER_CAPACITY_H_

#include <cstdint>
#include <string>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "common/types.h"
#include "proto/downpour.pb.h"

namespace downpour {

// Bytes per row of `spec` on one holder: its values and named vectors,
// and the built-in handler's state (0 for a plugin's, or a spec whose
// handler cannot be built).
uint64_t TableRowBytes(const proto::TableSpec& spec);

// Bytes one holder of [begin, end) of `spec` allocates (0 for sparse
// tables).
uint64_t RangeBytes(const proto::TableSpec& spec, Key begin, Key end);
// Bytes one holder of a range of `table` commits: RangeBytes for dense
// tables, a bounded sparse table's per-range cap, 0 otherwise.
uint64_t HeldBytes(const proto::TableMap& table,
                   const proto::RangeAssignment& r);

// Per server: the bytes of every range of `map`'s tables it holds.
absl::flat_hash_map<NodeId, uint64_t> CommittedBytes(
    const proto::ClusterMap& map);

// Per live server with a known limit: the bytes it has left (limit minus
// committed, at least 0). Servers without a limit are absent: unlimited.
absl::flat_hash_map<NodeId, uint64_t> RoomLeft(const proto::ClusterMap& map);

// Whether `placed` (a table placed with PlaceTable, not yet in `map`) fits
// every server it puts ranges on. kResourceExhausted naming the table, the
// first server that cannot hold its share (id and name), its share, what
// it has left and its limit.
absl::Status CheckTableFits(const proto::ClusterMap& map,
                            const proto::TableMap& placed);

// "1.5 GiB", "512 B": for messages.
std::string HumanBytes(uint64_t bytes);

}  // namespace downpour

#endif  // DOWNPOUR_SCHEDULER_CAPACITY_H_
