// Moving key ranges between servers while writes go on: what makes a
// server added to a running cluster take its share of the ranges (scale
// out), and a drained server give all of its away (scale in). Pure
// functions over the cluster map, which the scheduler calls under its lock
// (and tests call directly); the copying itself is the servers' catch-up
// and handover (server/internal/replicator.h).
//
// A move of range R from server F to server T (RangeAssignment.move_from,
// move_to) takes three maps:
//   1. StartMoves: T joins R's catching_up; F's primary (or F itself)
//      copies R to T while writes go on (r + 1 holders).
//   2. The primary reports T in sync (MarkInSync, placement.h). If F is a
//      backup, SettleMoves takes F off R in the same map: done. If F is
//      the primary, SettleMoves starts a handover to T (handing_to).
//   3. F reports the handover (HandOver, placement.h): T becomes primary,
//      and SettleMoves takes F off R in the same map: done.
// R has r holders throughout: F leaves only once T holds everything F
// acknowledged. A move whose target dies or leaves R is cancelled (the old
// holders keep serving); one whose source dies leaves T as an ordinary
// backup. Nothing else moves a range that has a move under way (handovers
// for balance, further moves).
//
// Which ranges move (StartMoves), at most `max_moves` at a time, among the
// ranges that have all their holders (a range short of them is refilled
// first, placement.h's Refill):
//   - every range held by a draining server (NodeInfo.draining), to the
//     live, non-draining server with room that holds the least;
//   - then, for balance: per table, from the server holding the most of
//     its ranges to the one holding the fewest while they differ by two or
//     more (every table's ranges, and so its traffic, spread out);
//   - then from the live server holding the most bytes to the one holding
//     the least, while the most is more than 10% above the mean, a range
//     of weight w only if 2w <= their difference (the move never
//     overshoots, so a balanced cluster stays still and every move evens
//     the pair out), of a table the giver holds more of.
// A range's weight is the bytes one holder keeps: dense tables from their
// shape (capacity.h), sparse ones as their primary reports them (`sizes`;
// at least 1 byte, so that equal tables spread by range count). Under
// Balance::kLoad it is the range's load instead (load follows the keys:
// the busiest server gives a hot range to the least busy one), as long as
// the busiest is above the mean by more than the tolerance.
//
// Thread-compatible; no I/O.
#ifndef DOWNPOUR_SCHEDULER_MOVES_H_
#define DOWNPOUR_SCHEDULER_MOVES_H_

#include <cstdint>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "common/types.h"
#include "proto/downpour.pb.h"

namespace downpour {

struct MoveOptions {
  // Holders of each range (the scheduler's --replicas).
  int replicas = 1;
  // Moves under way at once over the whole cluster (drains first).
  int max_moves = 2;
  // Move ranges for balance, not only off draining servers.
  bool balance = true;
  // What is balanced: the bytes each server holds, or its load (each
  // range's measured requests and rows per second, as `sizes` gives them
  // then, counted on every holder). A server is relieved only when it
  // holds more than the mean by more than `tolerance` (sparse tables grow,
  // rates are noisy, and a move costs a copy).
  enum class Balance { kBytes, kLoad };
  Balance by = Balance::kBytes;
  double tolerance = 0.1;
};

// A weight per (table, range begin): under Balance::kBytes the bytes of
// sparse ranges as their primaries report them (dense ones are known from
// their shape); under kLoad each range's load.
using RangeSizes = absl::flat_hash_map<std::pair<TableId, Key>, uint64_t>;

// Whether `server` is listed ALIVE and draining.
bool Draining(const proto::ClusterMap& map, NodeId server);

// Starts moves (see above). `room`: bytes each server has left
// (capacity.h's RoomLeft; absent: unlimited), shrunk by the moves started;
// `excluded`: (server, table) pairs never chosen. Returns whether anything
// changed.
bool StartMoves(
    proto::ClusterMap* map, const MoveOptions& options,
    absl::flat_hash_map<NodeId, uint64_t>* room = nullptr,
    const absl::flat_hash_set<std::pair<NodeId, TableId>>* excluded = nullptr,
    const RangeSizes* sizes = nullptr);

// Moves every move on as far as the map allows (steps 2 and 3 above) and
// cancels those whose target no longer holds the range or is not alive, or
// whose source left it. A source leaves only a range that keeps `replicas`
// holders without it (one lost meanwhile: it stays as a backup). Ranges in
// `no_handover` (table, begin) do not start their handover now (one was
// just cancelled as too slow: the range takes writes again for a while).
// Idempotent; call after every change of holders. Returns whether anything
// changed.
bool SettleMoves(
    proto::ClusterMap* map, int replicas,
    const absl::flat_hash_set<std::pair<TableId, Key>>* no_handover = nullptr);

// Cancels the moves off `server` (a drain called off): a target still
// catching up leaves the range again, a handover to it is called off.
// Returns whether anything changed.
bool CancelMovesFrom(proto::ClusterMap* map, NodeId server);

// Moves under way in `map`.
int MovesUnderWay(const proto::ClusterMap& map);
// Ranges (over every table) `server` holds as primary or backup, and of
// those, how many are moving off it.
int RangesHeld(const proto::ClusterMap& map, NodeId server);
int MovesFrom(const proto::ClusterMap& map, NodeId server);

// Whether `server` may be drained: kFailedPrecondition when the live,
// non-draining servers other than it would be fewer than max(1, replicas)
// (nobody left to take its ranges with r holders each).
absl::Status CheckDrainable(const proto::ClusterMap& map, NodeId server,
                            int replicas);

}  // namespace downpour

#endif  // DOWNPOUR_SCHEDULER_MOVES_H_
