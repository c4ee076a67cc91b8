// Cutting a range a server holds into pieces, in place, when the cluster
// map splits it (and joining neighbours into one when it merges them,
// MergeRanges, below) (RangeAssignment.split_at; scheduler/splits.h): the rows
// (values, handler state, named vectors; a sparse range's cold rows and
// admission counters too), the client ledger (each piece gets all of it: a
// write the range applied is applied in every piece it touched, and a
// retry of it is answered as applied wherever it goes), Sandblaster task
// rounds (likewise), and the BSP step clocks (each part cut where the
// pieces meet, each cut keeping the part's clock: a worker's retried or
// next push is cut there too, by its client on the new map).
//
//   DP_ASSIGN_OR_RETURN(auto pieces, SplitRange(shard, range, {150}));
//   shard.RemoveRange(range.range().begin);
//   for (auto& p : pieces) shard.AddRange(std::move(p));
//
// The range must be quiet: no held BSP steps (abandoned first), no writes
// in flight. The pieces are fresh stores: the split copies the range once
// (a dense piece is allocated whole), so for a while the server holds it
// twice.
//
// Data thread only, like the range.
#ifndef DOWNPOUR_SERVER_INTERNAL_RANGE_SPLIT_H_
#define DOWNPOUR_SERVER_INTERNAL_RANGE_SPLIT_H_

#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "server/internal/range_store.h"
#include "server/internal/table_shard.h"

namespace downpour {
namespace server_internal {

// The pieces [begin, cuts[0]), [cuts[0], cuts[1]), ..., [cuts.back(), end)
// of `range`, holding what it holds; `range` itself is not changed. Roles
// and primaries are `range`'s. kInvalidArgument unless the cuts ascend
// strictly inside the range; kDataLoss if its rows cannot be read back.
absl::StatusOr<std::vector<std::unique_ptr<TableShard::Range>>> SplitRange(
    const TableShard& shard, const TableShard::Range& range,
    absl::Span<const Key> cuts);

// One range holding what `pieces` hold, for a merge of neighbours
// (RangeAssignment.merge): the pieces, end to end in key order, become
// [pieces.front().begin, pieces.back().end) with all their rows, their
// client ledgers joined (a write any piece applied counts as applied: the
// scheduler merges only across a boundary older than any retry, so no
// write was cut across it), their task rounds joined (the newest open
// round of each vector, with the tasks applied in it) and their BSP step
// parts kept. Role, primary and backups: the first piece's. The pieces are
// not changed; like SplitRange, the merge copies them once. kInvalidArgument
// unless there are two or more pieces, end to end; kDataLoss if rows cannot
// be read back.
absl::StatusOr<std::unique_ptr<TableShard::Range>> MergeRanges(
    const TableShard& shard, absl::Span<const TableShard::Range* const> pieces);

// The ledgers of neighbours, joined as MergeRanges joins them.
proto::RangeLedgers JoinLedgers(absl::Span<const proto::RangeLedgers> parts);

// The rows of `chunk` whose keys lie in [lo, hi), as a chunk of their own
// (`out` replaced). `width` and `state_width`: the table's.
void SliceChunk(const RowChunk& chunk, Key lo, Key hi, size_t width,
                size_t state_width, RowChunk* out);

}  // namespace server_internal
}  // namespace downpour

#endif  // DOWNPOUR_SERVER_INTERNAL_RANGE_SPLIT_H_
