// The tables of the cluster map: declaration (checked, placed, published,
// rolled back on a server's refusal), the tables still being declared, the
// servers that refused a table, and the ranges' holders as servers die,
// come back, catch up and hand ranges over (the rules are placement.h's
// and capacity.h's; this applies them to the map).
//
//   DP_ASSIGN_OR_RETURN(proto::TableSpec spec, SpecToDeclare(req.spec(), p));
//   ... lock ...
//   DP_RETURN_IF_ERROR(tables.Create(lock, spec, deadline, timeout, &reply));
//   tables.TableFailed(server, failure);   // AckEpoch: rolls a table back
//   tables.ResolvePending();               // after any acknowledgement
//
// A declaration is all or nothing: the table enters the map only if every
// live server can hold its share and the map stays small, and leaves it
// again if a server reports it cannot create it. Until every server that
// was live at its declaration acknowledged its epoch, the table is
// pending: an identical declaration waits for the outcome.
//
// Thread-compatible: the scheduler's mutex guards it and the map; Create
// takes that mutex and releases it while it waits.
#ifndef DOWNPOUR_SCHEDULER_TABLE_REGISTRY_H_
#define DOWNPOUR_SCHEDULER_TABLE_REGISTRY_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/types.h"
#include "consistency/consistency.h"
#include "proto/downpour.pb.h"
#include "scheduler/durable_state.h"
#include "scheduler/membership.h"
#include "scheduler/moves.h"
#include "scheduler/scheduler_mutex.h"
#include "scheduler/splits.h"

namespace downpour {

struct TableRegistryOptions {
  // Holders of each range: a primary and replicas - 1 backups.
  int replicas = 1;
  // Balance primaries by handing ranges to in-sync backups; a handover not
  // reported within handover_timeout is cancelled.
  bool balance_primaries = true;
  absl::Duration handover_timeout = absl::Seconds(2);
  // Live servers a declaration waits for (at least one).
  int min_servers = 1;
  size_t max_map_bytes = size_t{1} << 20;
  // A new table gets at least this many ranges (else one per live server),
  // so that it can spread over servers added later.
  int min_ranges = 0;
  // Ranges move to servers added later and off drained ones (moves.h):
  // at most max_moves at a time; `rebalance` moves them for balance too,
  // else only off drained servers.
  bool rebalance = true;
  int max_moves = 2;
  // What rebalancing evens out: table bytes per server, or load (each
  // range's requests and rows per second, from the primaries' reports).
  MoveOptions::Balance balance_by = MoveOptions::Balance::kBytes;
  // Under balance_by = kLoad: a range too hot to move whole is split
  // (splits.h) while the busiest server's load is more than
  // split_threshold times the mean and no move evens it out.
  bool split_hot_ranges = true;
  double split_threshold = 1.3;
  // Under balance_by = kLoad: neighbours on the same servers whose load
  // together is at most merge_threshold times a range's mean load are
  // merged (splits.h), one pair at a time.
  bool merge_cold_ranges = true;
  double merge_threshold = 0.25;
  // A boundary between ranges is merged away only once it is this old
  // (by this scheduler's clock; a restarted scheduler counts from its
  // start): a write first cut on a map without it may be retried, cut in
  // two, until then. As long as the servers' client ledgers remember an
  // idle client (server_internal::ClientLedger), which rests on the same
  // bound on retries.
  absl::Duration merge_min_age = absl::Minutes(10);
};

// The spec a declaration of `spec` asks for: its id cleared, and for a
// table that follows the job, the job's enforcement (`policy`'s
// sync_workers and tracked_workers); then its shape checked
// (ValidateTableShape). kInvalidArgument, also for a table that follows the
// job but sets sync_workers or num_workers itself. Needs no lock.
absl::StatusOr<proto::TableSpec> SpecToDeclare(const proto::TableSpec& spec,
                                               const ConsistencyPolicy& policy);

class TableRegistry {
 public:
  // Borrowed, must outlive this object: `map` (its tables), the nodes, and
  // the state it commits changes to.
  TableRegistry(const TableRegistryOptions& options, proto::ClusterMap* map,
                const Membership* members, DurableState* durable);

  // Declares `spec` (from SpecToDeclare) and waits until every live server
  // acknowledged it, or `deadline` (`timeout` after the call, for
  // messages). An identical existing table: OK, created false, once it is
  // declared. Errors: kAlreadyExists for a table of that name with another
  // spec; kUnavailable for fewer than min_servers live servers by the
  // deadline, a state that cannot be written, or the scheduler stopping;
  // kInvalidArgument / kNotFound (ValidateTableSpec), kResourceExhausted
  // (capacity, the map's size); kDeadlineExceeded if servers did not all
  // acknowledge in time (the table stays pending); a server's own error if
  // it cannot create the table (removed again); kAborted if an existing
  // table was removed while waiting.
  absl::Status Create(SchedulerMutex& lock, const proto::TableSpec& spec,
                      absl::Time deadline, absl::Duration timeout,
                      proto::CreateTableReply* reply)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(lock.mu);

  // Server `node` reports that it cannot create or hold table
  // `f.table_id()`. A table still being declared is removed (a new epoch);
  // for a table in use, the server is taken off the ranges it was catching
  // up on and not chosen for that table again. Commits.
  void TableFailed(NodeId node, const proto::TableFailure& f);
  // Tables every server they wait for has acknowledged are declared.
  void ResolvePending();

  // A primary's report (proto::ReplicaReadyRequest): a handover done (only
  // from the current map, else kFailedPrecondition) or a backup in sync;
  // then primaries are balanced and the map gets a new epoch. The caller
  // commits. kFailedPrecondition if the map no longer agrees.
  absl::Status ReplicaReady(const proto::ReplicaReadyRequest& req);
  // Handovers not reported within handover_timeout of the first sweep that
  // saw them are cancelled; returns whether any was.
  bool CancelSlowHandOvers(absl::Time now);

  // Server `id` died: its ranges go to their in-sync backups (counted).
  void RemoveDeadServer(NodeId id);

  // --- Moving ranges (moves.h) ---
  // Starts, moves on and cancels moves: off draining servers, and for
  // balance. The caller bumps the epoch and commits if it returns true.
  bool Rebalance();
  // Drains a server, or calls a drain off (proto::DrainRequest, whose
  // comment gives the errors), and fills `reply` with how far it is. A
  // change bumps the epoch; the caller commits.
  absl::Status Drain(const proto::DrainRequest& req, proto::DrainReply* reply);
  // Starts a split (proto::SplitRangeRequest, whose comment gives the
  // errors): a new epoch; the caller commits.
  absl::StatusOr<proto::SplitRangeReply> Split(
      const proto::SplitRangeRequest& req);
  uint64_t splits_started() const { return splits_started_; }
  uint64_t splits_done() const { return splits_done_; }
  uint64_t merges_started() const { return merges_started_; }
  uint64_t merges_done() const { return merges_done_; }
  // Whether server `id` still holds a range (it may not leave).
  bool HoldsRanges(NodeId id) const;
  // No range moves from now on (the scheduler is stopping): drains are
  // called off and refused (kUnavailable), moves under way cancelled.
  // Returns whether the map changed (the caller bumps the epoch).
  bool StopMoving();
  // A primary's figures for its ranges (HeartbeatRequest.ranges): the
  // bytes of sparse ranges, and every range's load (requests and rows per
  // second, smoothed over the reports): the weights of moves.h. `now`: when
  // the report arrived.
  void ReportRanges(NodeId primary, const proto::HeartbeatRequest& req,
                    absl::Time now);
  uint64_t moves_started() const { return moves_started_; }
  uint64_t moves_done() const { return moves_done_; }
  // Server `id` came back as a new process: ranges only it held are lost
  // (counted). Returns whether anything changed.
  bool ForgetServerData(NodeId id);
  // Backups for ranges short of them, only on servers with room for them
  // and not on a server that could not hold that table before; then moves
  // (Rebalance). Returns whether anything changed.
  bool RefillWithinRoom();
  // `node` registered again or was forgotten: what it refused is forgotten.
  void ForgetRefusals(NodeId node);

  // A restore: the map's tables become `m`'s, each range on the server
  // (named in `m`, ALIVE in the map) holding its rows, lost until loaded.
  // REQUIRES: every server `m` names is in the map.
  void LoadCheckpoint(const proto::CheckpointManifest& m);
  // The restore loaded every range: served again, backups refilled.
  void ServeRestored();

  // Next table id, pending tables and refusals.
  void Export(proto::SchedulerState* state) const;
  // REQUIRES: the map loaded already.
  void Import(const proto::SchedulerState& state);

  uint64_t promotions() const { return promotions_; }
  uint64_t ranges_lost() const { return ranges_lost_; }

 private:
  // A table declared but not yet acknowledged by every server that was
  // live when it was declared.
  struct PendingTable {
    TableId id = kNoTable;
    std::string name;
    Epoch epoch = 0;
    std::vector<NodeId> waiting;
    bool resolved = false;  // acknowledged by all, or failed
    absl::Status failure;   // a server could not create it: rolled back
  };

  // The existing table named like `spec` (nullptr if none); kAlreadyExists
  // if its spec differs (ids aside).
  absl::StatusOr<const proto::TableMap*> FindTable(
      const proto::TableSpec& spec) const;
  const proto::TableMap* FindTableById(TableId id) const;
  // Waits until every server `p` waits for has acknowledged its epoch
  // (OK), or one reported that it cannot create it (its error; the table
  // is gone from the map), or `deadline` (kDeadlineExceeded naming the
  // servers; the table stays pending).
  absl::Status AwaitDeclared(SchedulerMutex& lock, PendingTable& p,
                             absl::Time deadline)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(lock.mu);
  // The servers `p` still waits for: alive, and behind its epoch.
  std::vector<NodeId> Late(const PendingTable& p) const;
  void Resolve(PendingTable& p);
  void RemoveTable(TableId id);
  // SettleMoves, counting the moves it ends; cancels splits that cannot go
  // on (CancelStaleSplits).
  bool Settle();
  // Splits a range if load calls for it (PickSplit); whether it did.
  bool SplitForLoad();
  // Merges cold neighbours if load calls for it (PickMerge); whether it
  // did.
  bool MergeForLoad();
  // Starts merging at the boundary `at` of table `id` (the range holding
  // `key` and the next), refused while the boundary is younger than
  // merge_min_age.
  absl::StatusOr<proto::RangeAssignment> StartMergeAt(TableId id, Key key,
                                                      Key* upper_end);
  // The primary of a merging range reported it quiet (ReplicaReady); the
  // merge is done once both neighbours have. Whether the map changed.
  absl::StatusOr<bool> MergeReported(TableId table, Key begin, NodeId primary);
  // Forgets the quiet reports of ranges no longer being merged, and those
  // of a primary the range no longer has (a failover during the merge:
  // the new primary fences the range anew and reports it itself).
  void PruneMergeQuiet();
  // Boundaries younger than merge_min_age, by (table, first key above).
  absl::flat_hash_set<std::pair<TableId, Key>> YoungBoundaries() const;

  const TableRegistryOptions options_;
  proto::ClusterMap* const map_;
  const Membership* const members_;
  DurableState* const durable_;
  TableId next_table_id_ = 1;
  // Tables being declared, by id.
  absl::flat_hash_map<TableId, std::shared_ptr<PendingTable>> pending_;
  // (server, table) pairs the server reported it cannot hold: never chosen
  // as a backup for that table (until the server registers again).
  absl::flat_hash_set<std::pair<NodeId, TableId>> refused_;
  // When the handovers under way began (CancelSlowHandOvers).
  absl::Time handover_started_ = absl::InfiniteFuture();
  RangeSizes sizes_;
  // Each range's load: the counters of its primary's last report and the
  // smoothed rate (requests + rows per second).
  struct Load {
    NodeId primary = kNoNode;
    uint64_t requests = 0, keys = 0;
    absl::Time at;
    double rate = 0;
    int rates = 0;  // rates measured (0: no rate yet)
    Key split_key = 0;
  };
  absl::flat_hash_map<std::pair<TableId, Key>, Load> loads_;
  bool moving_stopped_ = false;
  // Moves whose handover was cancelled as too slow, and until when they
  // wait before handing over again (the range takes writes meanwhile).
  absl::flat_hash_map<std::pair<TableId, Key>, absl::Time> handover_held_off_;
  uint64_t moves_started_ = 0;
  uint64_t moves_done_ = 0;  // completed or cancelled
  uint64_t splits_started_ = 0;
  uint64_t splits_done_ = 0;  // completed (a cancelled one is not)
  uint64_t merges_started_ = 0;
  uint64_t merges_done_ = 0;
  // When each boundary a split made here was made; any other boundary
  // counts from `started_`.
  absl::flat_hash_map<std::pair<TableId, Key>, absl::Time> boundary_born_;
  const absl::Time started_ = absl::Now();
  // Merging ranges reported quiet, by (table, begin): the primary that
  // reported it (a report counts only while that server is the primary).
  absl::flat_hash_map<std::pair<TableId, Key>, NodeId> merge_quiet_;
  uint64_t promotions_ = 0;   // ranges a backup took over from a dead primary
  uint64_t ranges_lost_ = 0;  // ranges marked lost
};

}  // namespace downpour

#endif  // DOWNPOUR_SCHEDULER_TABLE_REGISTRY_H_
