// Splitting key ranges: what lets load follow the keys when one range is
// too hot to move whole. Pure functions over the cluster map, which the
// scheduler calls under its lock (and tests call directly); the split
// itself is done by the holders, in place (server/internal/dispatcher.h).
//
// A split of range R = [b, e) at m takes two maps:
//   1. StartSplit: R.split_at = m. R's primary refuses writes to R (the
//      clients retry), waits until every write it applied is on R's in-sync
//      backups, and reports R quiet (a handover report to itself).
//   2. FinishSplit, on that report: the map lists [b, m) and [m, e) with
//      R's primary and backups. Each holder cuts what it holds of R in two
//      (rows, client ledger, BSP step clocks); nothing is copied between
//      servers, so R's r copies exist throughout.
// Only a range with all its holders in sync and nothing else under way (no
// move, handover, copy to a new backup, loss) is split, and a split is
// cancelled (CancelStaleSplits) as soon as that stops being so, or when its
// primary dies: the range then serves on unsplit. Moves (moves.h) leave a
// range alone while it is being split.
//
// Splits are not undone: neighbours are not merged (a merged range's client
// ledger would have to know which half a retried write reached; see
// docs/ARCHITECTURE.md "Splitting ranges").
//
// Thread-compatible; no I/O.
#ifndef DOWNPOUR_SCHEDULER_SPLITS_H_
#define DOWNPOUR_SCHEDULER_SPLITS_H_

#include <cstdint>
#include <optional>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "common/types.h"
#include "proto/downpour.pb.h"

namespace downpour {

// Ranges a table may be split into (by psctl split and by load).
inline constexpr int kMaxRangesPerTable = 1024;

// Starts splitting the range of table `table` that holds `key` at `key`.
// Returns the range as it now stands (split_at set). Errors as
// proto::SplitRangeRequest's comment gives them (kNotFound, kOutOfRange,
// kFailedPrecondition, kResourceExhausted, kUnavailable).
absl::StatusOr<proto::RangeAssignment> StartSplit(proto::ClusterMap* map,
                                                  TableId table, Key key);

// The primary of the range of `table` beginning at `begin` reports it quiet
// (step 2 above): the map lists its two halves. kFailedPrecondition if no
// split of that range by that primary is under way.
absl::Status FinishSplit(proto::ClusterMap* map, TableId table, Key begin,
                         NodeId primary);

// Cancels the splits of ranges that no longer have all their holders in
// sync, whose primary is not alive, or that something else now changes.
// Returns whether any was.
bool CancelStaleSplits(proto::ClusterMap* map);
// Cancels every split under way (a split not reported in time, like a
// handover). Returns whether any was.
bool CancelSplits(proto::ClusterMap* map);

int SplitsUnderWay(const proto::ClusterMap& map);

// Which range load calls for splitting: with every range's load
// (`load`, by (table, begin), counted on each holder as moves.h weighs it)
// and the key its primary found at the median of its traffic
// (`split_keys`), the hottest splittable range of the busiest live server
// if that server's load is more than `threshold` times the mean, split at
// its median key. nullopt otherwise. The caller asks only once no
// whole-range move evens the load out (moves.h's StartMoves moved nothing).
struct SplitChoice {
  TableId table = kNoTable;
  Key begin = 0;
  Key at = 0;
};
std::optional<SplitChoice> PickSplit(
    const proto::ClusterMap& map,
    const absl::flat_hash_map<std::pair<TableId, Key>, uint64_t>& load,
    const absl::flat_hash_map<std::pair<TableId, Key>, Key>& split_keys,
    double threshold);

}  // namespace downpour

#endif  // DOWNPOUR_SCHEDULER_SPLITS_H_
