// A backup's side of replication: applying one message of its primary's
// stream for a range (server/internal/replicator.h) to the range's store
// and ledgers.
//
//   COPY_BEGIN  the primary's ledgers (BSP steps, task rounds, client
//               ledger) replace the range's; a sparse range starts empty
//   COPY_ROWS   a chunk of rows (RangeStore::ImportRows) overwrites them
//   COPY_END    nothing (the primary reports the copy done)
//   WRITE       the write as the primary applied it (put, add, push, a
//               BSP step's mean, a vector command restricted to the
//               range), recorded in the ledgers as the primary did
//
// The primary checked every write; the checks here only keep a malformed
// message from touching memory it should not (kInvalidArgument; a bad
// chunk is kDataLoss). Nothing changes when one fails.
// Thread-compatible: the server's data thread calls it.
#ifndef DOWNPOUR_SERVER_INTERNAL_REPLICA_APPLY_H_
#define DOWNPOUR_SERVER_INTERNAL_REPLICA_APPLY_H_

#include "absl/status/status.h"
#include "server/internal/table_shard.h"
#include "transport/frames.h"

namespace downpour {
namespace server_internal {

// REQUIRES: `range` is held as a backup and the request's replication
// kind is not NONE.
absl::Status ApplyReplicated(TableShard& shard, TableShard::Range& range,
                             const IncomingMessage& request);

}  // namespace server_internal
}  // namespace downpour

#endif  // DOWNPOUR_SERVER_INTERNAL_REPLICA_APPLY_H_
