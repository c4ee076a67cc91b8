// What a range holds besides its rows (BSP step clocks, Sandblaster task
// rounds, the client ledger) as one proto::RangeLedgers, for a checkpoint
// and its restore: the same form in which a replica copy carries them
// (Replication.ledgers).
//
// Data thread only, like the range itself.
#ifndef DOWNPOUR_SERVER_INTERNAL_RANGE_LEDGERS_H_
#define DOWNPOUR_SERVER_INTERNAL_RANGE_LEDGERS_H_

#include "absl/time/time.h"
#include "proto/downpour.pb.h"
#include "server/internal/table_shard.h"

namespace downpour {
namespace server_internal {

void ExportLedgers(const TableShard::Range& range, proto::RangeLedgers* out);
// Replaces the range's ledgers (held BSP steps are dropped: their waiters
// must have been answered). `now` counts as the clients' last activity.
void ImportLedgers(const proto::RangeLedgers& in, absl::Time now,
                   TableShard::Range* range);

}  // namespace server_internal
}  // namespace downpour

#endif  // DOWNPOUR_SERVER_INTERNAL_RANGE_LEDGERS_H_
