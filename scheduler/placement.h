// Where a table's key ranges live, and how that changes when servers come
// and go: pure functions over the cluster map, which the scheduler calls
// under its lock (and tests call directly).
//
// Each range has a primary, in-sync backups (`replicas`, promotable) and
// backups being copied to (`catching_up`). The rules:
//   - A new table's ranges go round the ring of live servers: range i has
//     its primary on server i and its backups on the next r - 1 servers.
//     Fresh ranges hold only initial values, so those backups are in sync
//     from the start.
//   - A dead server leaves every range. Where it was primary, the first
//     in-sync backup is promoted; the other in-sync backups are moved to
//     catching_up (they may have applied a different prefix of the dead
//     primary's last writes, so they get a fresh copy from the new one).
//     With no in-sync backup the dead primary stays (reads and writes get
//     kUnavailable naming it) until it comes back.
//   - A server that comes back as a new incarnation has lost its memory:
//     a range it is still primary of is marked lost (kDataLoss) and it is
//     dropped from the backups of any range.
//   - Ranges with fewer than r holders get catching-up backups on the live
//     servers holding the fewest ranges (never twice the same server, never
//     a draining one, and only one with room for the range, when Refill is
//     told the room).
//   - A catching-up backup becomes in sync when its primary reports the
//     copy done (MarkInSync).
//   - Primaries are balanced (BalancePrimaries): after a failover the
//     survivors are primary of every range, and a server that comes back
//     only replays. A range whose primary is primary of at least two more
//     ranges of its table than one of its live in-sync backups is handed
//     to that backup (handing_to; not to a draining backup, and not for a
//     range being moved, moves.h); the primary stops writing it and,
//     once its backups hold everything it applied, reports; HandOver then
//     swaps the two. A handover whose primary or target leaves the range
//     is cancelled.
//
// Thread-compatible; no I/O.
#ifndef DOWNPOUR_SCHEDULER_PLACEMENT_H_
#define DOWNPOUR_SCHEDULER_PLACEMENT_H_

#include <cstdint>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "common/types.h"
#include "proto/downpour.pb.h"

namespace downpour {

// Live servers of `map`, in id order.
std::vector<NodeId> LiveServers(const proto::ClusterMap& map);

// Splits a new table's key space into one range per server, or
// `min_ranges` if more (fewer if it has fewer keys: a range holds at least
// one), and places primaries and `replicas - 1` backups round the ring of
// `servers` (range i's primary on server i mod n). More ranges than
// servers let a table spread over servers added later (moves.h).
// REQUIRES: servers non-empty, replicas >= 1.
void PlaceTable(proto::TableMap* table, const std::vector<NodeId>& servers,
                int replicas, int min_ranges = 0);

// Takes `dead` out of every range (see the rules above). Returns whether
// anything changed.
bool RemoveServer(proto::ClusterMap* map, NodeId dead);

// `server` came back as a new incarnation (its memory is gone): ranges it
// is primary of are marked lost, and it leaves every backup list. Returns
// whether anything changed.
bool ForgetServerData(proto::ClusterMap* map, NodeId server);

// Adds catching-up backups to every range with fewer than `replicas`
// holders and a live primary, from the live servers that hold the fewest
// ranges. With `room` (bytes each server has left, scheduler/capacity.h;
// a server absent from it is unlimited), a server is chosen only for a
// range it has room for, and its room shrinks by the range's bytes; a
// range nobody has room for stays short of backups. Servers in
// `excluded` (server, table) pairs are never chosen for that table.
// Returns whether anything changed.
bool Refill(
    proto::ClusterMap* map, int replicas,
    absl::flat_hash_map<NodeId, uint64_t>* room = nullptr,
    const absl::flat_hash_set<std::pair<NodeId, TableId>>* excluded = nullptr);

// Takes `server` off the catching-up backups of every range of `table`
// (it reported that it cannot hold the table). Returns whether anything
// changed.
bool DropCatchingUp(proto::ClusterMap* map, TableId table, NodeId server);

// Whether any range of any table names `server` (as primary or backup).
bool HoldsAnyRange(const proto::ClusterMap& map, NodeId server);

// `backup`, catching up on a range of `table` that begins at `begin`, now
// holds it, as `primary` reports. kFailedPrecondition if the map no longer
// agrees (another primary, or the backup is not catching up there).
absl::Status MarkInSync(proto::ClusterMap* map, TableId table, Key begin,
                        NodeId primary, NodeId backup);

// Starts handovers (RangeAssignment.handing_to) that even out, per table,
// how many ranges each live server is primary of (see the rules above).
// Ranges lost, already handing over, or whose primary is not alive are
// left alone. Returns whether anything changed.
bool BalancePrimaries(proto::ClusterMap* map);

// `primary` reports the range of `table` beginning at `begin` ready to hand
// to `to`: `to` becomes its primary and `primary` takes `to`'s place among
// the in-sync backups. kFailedPrecondition if the map no longer names
// that handover.
absl::Status HandOver(proto::ClusterMap* map, TableId table, Key begin,
                      NodeId primary, NodeId to);

// Whether any range is being handed over.
bool HandOversUnderWay(const proto::ClusterMap& map);

// Cancels every handover under way (a primary that never reported). Returns
// whether there was any.
bool CancelHandOvers(proto::ClusterMap* map);

}  // namespace downpour

#endif  // DOWNPOUR_SCHEDULER_PLACEMENT_H_
