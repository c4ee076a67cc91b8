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
// A bounded sparse table's pieces keep row caps by their share of the key
// space (common/sparse_row_bytes.h), so its ranges are cut only near their
// middle (kMinBoundedPieceShare).
// Only a range with all its holders in sync and nothing else under way (no
// move, handover, copy to a new backup, loss) is split, and a split is
// cancelled (CancelStaleSplits) as soon as that stops being so, or when its
// primary dies: the range then serves on unsplit. Moves (moves.h) leave a
// range alone while it is being split.
//
// Merging neighbours undoes a split, with the same two steps: StartMerge
// marks both ranges (RangeAssignment.merge), each primary fences its range
// and reports it quiet, and FinishMerge, once both have, lists the one
// range. Only neighbours held by the same servers, all in sync, are
// merged, and the caller merges only across a boundary older than any
// write a client may still retry (a write cut across it would read as
// applied in the merged range when only one half applied it; see
// docs/ARCHITECTURE.md "Merging ranges"). A table that aggregates BSP
// steps keeps aggregating the halves apart: the merged range lists their
// boundary as a step cut (RangeAssignment.step_cuts), which a later split
// there makes a range boundary again.
//
// Thread-compatible; no I/O.
#ifndef DOWNPOUR_SCHEDULER_SPLITS_H_
#define DOWNPOUR_SCHEDULER_SPLITS_H_

#include <cstdint>
#include <optional>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/statusor.h"
#include "common/types.h"
#include "proto/downpour.pb.h"

namespace downpour {

// Ranges a table may be split into (by psctl split and by load).
inline constexpr int kMaxRangesPerTable = 1024;
// A bounded sparse table's range is split only where each piece keeps at
// least 1/kMinBoundedPieceShare of its keys (and so of its row cap).
inline constexpr int kMinBoundedPieceShare = 8;

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

// Cancels the splits and merges of ranges that no longer have all their
// holders in sync, whose primary is not alive, or that something else now
// changes (for a merge: either neighbour, or their holders differ).
// Returns whether any was.
bool CancelStaleSplits(proto::ClusterMap* map);
// Cancels every split and merge under way (one not reported in time, like
// a handover). Returns whether any was.
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

// Starts merging the range of `table` that holds `key` with the range after
// it. Returns the lower range as it now stands (merge set) and, in
// `*upper_end`, where the merged range will end. Errors as
// proto::SplitRangeRequest's comment gives them. The boundary's age is the
// caller's to check.
absl::StatusOr<proto::RangeAssignment> StartMerge(proto::ClusterMap* map,
                                                  TableId table, Key key,
                                                  Key* upper_end);

// The lower range of the merge that the range of `table` beginning at
// `begin` is part of (itself or the range before it). kFailedPrecondition
// if that range is not being merged.
absl::StatusOr<Key> MergeLowerBegin(const proto::ClusterMap& map, TableId table,
                                    Key begin);

// Both neighbours of the merge whose lower range begins at `begin` were
// reported quiet: the map lists them as one range. kFailedPrecondition if
// no such merge is under way, or if the neighbours could not start it now
// (a holder died, a copy began): they stay apart.
absl::Status FinishMerge(proto::ClusterMap* map, TableId table, Key begin);

int MergesUnderWay(const proto::ClusterMap& map);

// Which neighbours load calls for merging: the eligible pair (as
// StartMerge takes them, boundary not in `young`) with the least load whose
// load together is at most `threshold` times the mean load of a range, and
// some load measured. nullopt otherwise. `at` is the boundary that goes.
std::optional<SplitChoice> PickMerge(
    const proto::ClusterMap& map,
    const absl::flat_hash_map<std::pair<TableId, Key>, uint64_t>& load,
    const absl::flat_hash_set<std::pair<TableId, Key>>& young,
    double threshold);

}  // namespace downpour

#endif  // DOWNPOUR_SCHEDULER_SPLITS_H_
