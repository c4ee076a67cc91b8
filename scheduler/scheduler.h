// ps_scheduler: membership, heartbeats, the versioned cluster map, table
// declaration, named barriers and the workers' clock table, served over gRPC
// (proto::Scheduler).
//
//   SchedulerOptions o;  // listen_address "127.0.0.1:0": any free port
//   auto scheduler = Scheduler::Create(o);   // serving when it returns
//   SchedulerClient client((*scheduler)->address());
//   ...
//   (*scheduler)->Shutdown();                // or destroy it
//
// Every change to membership or tables produces a new map with a larger
// epoch, streamed to watchers (WatchClusterMap).
//
// Liveness: every registered node heartbeats every heartbeat_interval (told
// to them in RegisterReply). A SERVER or WORKER silent for `dead_after` is
// marked DEAD by a sweep that runs every heartbeat_interval / 2 (one epoch
// bump per sweep that changed anything), and forgotten (removed from the
// map, a worker's rank freed) `forget_dead_after` later once no key range
// names it. A CLIENT silent for `dead_after` is forgotten at once: it holds
// no data and no rank. A DEAD node's Heartbeat gets kFailedPrecondition; it
// must Register again under the same name and role, and then gets its old
// id back; a forgotten node's Heartbeat gets kNotFound (register again).
//
// Table declaration is all or nothing. CreateTable checks the spec (strings
// bounded, shape, handler), then the memory every server would need for
// its share of the new table (primary and backups, scheduler/capacity.h)
// against what it reported at registration, and the map's size, before the
// table enters the map. Servers then report, with AckEpoch, tables they
// could not create (a plugin refusing its parameters, no memory left): the
// table is removed again (a new epoch) and CreateTable fails with that
// server's error naming it. Until every server acknowledged the table, an
// identical CreateTable waits for the outcome rather than answering OK.
//
// Clocks: AdvanceClock and WaitClock are accepted only from the node that
// holds the rank (kPermissionDenied otherwise). Clocks only move forward,
// and under BSP and SSP(s) no worker may be more than s + 1 ahead of the
// slowest (consistency.h, ClockTable::WithinBound): a report beyond that
// waits `clock_report_grace` for the others' reports, then gets
// kFailedPrecondition with the reason, changing nothing.
//
// Replication and failover (scheduler/placement.h): every range has a
// primary and up to replicas - 1 backups. A dead server's ranges go to their
// first in-sync backup (a new epoch) and new backups are chosen to restore
// the count; a backup becomes promotable once its primary reports it caught
// up (ReplicaReady). A range whose only holder died keeps it (clients get
// kUnavailable naming it) until it registers again: as the same incarnation
// (it was cut off, its data is intact) it serves again; as a new one the
// range is marked lost (kDataLoss). This never silently hands a range to a
// server that lacks its data.
//
// Worker ranks: a worker that asks for a rank (RegisterRequest
// .requested_rank, e.g. its Indexed Job completion index) gets exactly that
// rank, taking it over from a DEAD holder, so a replaced pod takes its rank
// back; one that does not ask gets its old rank back if its name had one,
// else the smallest rank nobody holds.
//
// Lost workers (worker_roster.h): a worker that dies or leaves (Leave)
// before finishing loses its rank until a replacement registers for it
// (same name or requested rank); the replacement is told the rank's clock
// (RegisterReply.start_clock) and continues from it. Up to b losses are
// absorbed by the backup workers; beyond that, after
// worker_loss.replace_timeout the rank is retired (continue) or the job
// fails: WaitClock, Barrier, AdvanceClock and workers' heartbeats then
// answer kAborted naming the lost worker, and JobStatus.failure says it.
//
// Tables declared with TableSpec.follows_job get sync_workers and
// num_workers from the job's policy (ConsistencyPolicy::sync_workers,
// tracked_workers), so that every table of the job enforces the same
// contract whoever declares it.
//
// RPC errors (canonical codes): kInvalidArgument for a malformed request
// (no role or an unknown one, a name, endpoint or other string too long or
// with characters outside [A-Za-z0-9._-:/@+=] (scheduler/request_checks.h),
// a server without data endpoint, a requested rank outside the job, a bad
// table spec, a table that follows the job but sets sync_workers or
// num_workers itself, barrier count 0, a wait longer than 10 minutes);
// kAlreadyExists for registering a name that is ALIVE, a rank an ALIVE
// worker holds, or redeclaring a table with a different spec;
// kResourceExhausted for a worker when every rank is held, a table that
// does not fit a server's memory, a map that would pass max_map_bytes or
// max_nodes; kPermissionDenied for a worker without the job token, or a
// clock call for a rank the calling node does not hold; kNotFound for an
// unknown node id (or an unknown update handler); kFailedPrecondition for a
// heartbeat from a DEAD node, a worker name that asks for a rank other than
// its own, a rank given up (--on_worker_loss=continue), or a clock moving
// back or beyond the policy's bound; kAborted once the job failed for a
// lost worker (above); kUnavailable when CreateTable finds fewer than
// min_servers alive servers within its timeout, or the scheduler is shutting
// down; kDeadlineExceeded when CreateTable's servers do not all acknowledge the
// new epoch in time (the table stays declared, pending: a server's later
// failure report still removes it) or a Barrier times out; a server's own code
// (e.g. kInvalidArgument, kResourceExhausted) when it could not create the
// table.
//
// State (scheduler/state_store.h): with `state_dir`, nodes, tables, the
// map and its epoch, ranks, the job and the next ids are written (synced)
// before any change is published, and recovered by a scheduler started on
// the same directory: ids are never reused, and every node recovered as
// ALIVE gets a full dead_after to be heard from. Workers' clocks are
// written every few hundred milliseconds (lower bounds, raised by their
// next reports). A second scheduler on the same directory fails Create with
// kFailedPrecondition. Without it the state lives in memory: a restarted
// scheduler starts empty and may hand out ids again (a node that asks for
// its previous id gets it when nobody holds it).
//
// Checkpoints (scheduler/checkpoints.h; need state_dir and servers with a
// --data_dir): on demand (Checkpoint, the Checkpoint RPC), every
// `checkpoint_every_clocks` gating clocks and every `checkpoint_every`. The
// manifest is written once every server's part is durable; all but the
// newest `keep_checkpoints` are then deleted. Restore: a server that comes
// back as a new incarnation while being the only holder of a range (its
// data is gone) rolls the whole job back to the newest checkpoint: the
// scheduler waits for every server the manifest names, assigns each its
// ranges from the manifest, has it load them, and sets the workers' clocks
// to the manifest's; workers registering meanwhile get kUnavailable, and
// afterwards RegisterReply.start_clock. Tables declared after that
// checkpoint are dropped from the map. The RestoreCheckpoint RPC (psctl
// restore) rolls the job back the same way to a checkpoint it names.
//
// Thread-safe.
#ifndef DOWNPOUR_SCHEDULER_SCHEDULER_H_
#define DOWNPOUR_SCHEDULER_SCHEDULER_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "common/auth.h"
#include "consistency/consistency.h"
#include "metrics/registry.h"
#include "proto/downpour.pb.h"
#include "scheduler/worker_roster.h"

namespace downpour {

struct SchedulerOptions {
  std::string listen_address = "127.0.0.1:0";  // port 0: pick a free port
  // Told to nodes at Register.
  absl::Duration heartbeat_interval = absl::Milliseconds(200);
  // A SERVER or WORKER silent this long is marked DEAD.
  absl::Duration dead_after = absl::Seconds(3);
  // A node reported unreachable (a peer lost its connection to it, or its
  // map watch stream broke, which is what a killed process looks like) is
  // marked DEAD if it is not heard from for this long after the report.
  // Much shorter than dead_after: this is how failover stays under a
  // second, while a node that is only slow keeps its place.
  absl::Duration suspect_grace = absl::Milliseconds(400);
  // Holders of each key range: a primary and replicas - 1 backups on other
  // servers (fewer while there are fewer live servers).
  int replicas = 1;
  // Balance primaries across live servers by handing ranges to in-sync
  // backups (scheduler/placement.h). A primary that has not handed its
  // range over after handover_timeout keeps it (the handover is
  // cancelled): its writes are refused meanwhile.
  bool balance_primaries = true;
  absl::Duration handover_timeout = absl::Seconds(2);
  // CreateTable waits (up to its timeout) until this many servers are alive
  // (at least one in any case).
  int min_servers = 1;
  // A new table gets at least this many ranges (else one per live server),
  // so that servers added later can take some (scheduler/moves.h).
  int ranges_per_table = 0;
  // Elastic clusters (scheduler/moves.h): ranges move to servers that join
  // and, for balance, between servers (`rebalance`; off: only off drained
  // servers), at most `max_range_moves` at a time.
  bool rebalance = true;
  int max_range_moves = 2;
  // Rebalance by load (each range's requests and rows per second, as its
  // primary measures them) instead of table bytes: a server more than 10%
  // above the mean load gives its hot ranges to the least busy servers.
  bool balance_load = false;
  // With balance_load: a range too hot to move whole is split in two
  // (scheduler/splits.h) while the busiest server is more than 1.3 times
  // the mean.
  bool split_hot_ranges = true;
  // With balance_load: cold neighbours on the same servers are merged.
  bool merge_cold_ranges = true;
  // A boundary is merged away only once this old (TableRegistryOptions).
  absl::Duration merge_min_age = absl::Minutes(10);
  // The job's consistency contract; workers get ranks 0 .. N + b - 1, and
  // tables declared with follows_job get its enforcement fields.
  ConsistencyPolicy policy;
  // What the job does about a worker lost before finishing: how long it
  // waits for a replacement, then stop or continue (worker_roster.h).
  WorkerLossOptions worker_loss;
  // Applied to every call by the gRPC server (common/grpc_server.h): with a
  // secret, calls must carry the cluster token; with TLS, the service is
  // served over TLS (and demands client certificates under mutual TLS). The
  // health service stays open, for probes.
  ClusterAuth auth;
  // Keeps the scheduler's state in RocksDB here (see above); empty: in
  // memory only.
  std::string state_dir;
  // Checkpoint triggers (0: off); they need state_dir.
  int64_t checkpoint_every_clocks = 0;
  absl::Duration checkpoint_every = absl::ZeroDuration();
  // How long a checkpoint may take (a BSP cut waits for a step to end).
  absl::Duration checkpoint_timeout = absl::Seconds(60);
  int keep_checkpoints = 2;
  // How long a restore waits for the servers its checkpoint names before
  // logging them again (it keeps waiting).
  absl::Duration restore_wait = absl::Seconds(30);
  // If set (borrowed; must outlive the scheduler), the scheduler adds the
  // job's figures to it (scheduler/job_metrics.h).
  MetricsRegistry* metrics = nullptr;
  // Non-empty: only WORKER registrations carrying this token
  // (RegisterRequest.job_token) get a rank; others get kPermissionDenied.
  std::string job_token;
  // An AdvanceClock beyond what the policy allows (no worker more than
  // s + 1 ahead of the slowest) waits this long for the other workers'
  // reports, which travel separately and may lag, before it is refused.
  absl::Duration clock_report_grace = absl::Seconds(5);
  // Clocks tolerated beyond the policy's bound (a clock beyond bound + 1 +
  // slack is refused). 0: exact. Workers report asynchronously and
  // coalesce reports (a BSP worker, synchronized by the servers, may be
  // recorded several clocks behind), so a report may be ahead of the
  // others' record; it waits for theirs (clock_report_grace), and its claim
  // meanwhile admits theirs (ClockTable::Claim).
  int64_t clock_report_slack = 0;
  // A DEAD server or worker that no key range names any more is forgotten
  // (removed from the map, its rank freed) after this long.
  absl::Duration forget_dead_after = absl::Minutes(10);
  // Caps that keep the cluster map far below gRPC's 4 MiB message limit
  // whatever peers send: nodes listed (ALIVE and DEAD), and the map's
  // serialized size after a Register or CreateTable.
  int max_nodes = 4096;
  size_t max_map_bytes = size_t{1} << 20;
};

class Scheduler {
 public:
  // Recovers the state from state_dir (if set), starts the gRPC server
  // (with gRPC's default health service) and the liveness sweep.
  // kUnavailable if the address cannot be bound; kFailedPrecondition if
  // state_dir is in use by another scheduler or holds a different job.
  static absl::StatusOr<std::unique_ptr<Scheduler>> Create(
      const SchedulerOptions& options);
  virtual ~Scheduler() = default;  // Shutdown()

  // The bound port.
  virtual int port() const = 0;
  // "127.0.0.1:<port>", for clients on this host.
  std::string address() const { return absl::StrCat("127.0.0.1:", port()); }
  // Blocks until Shutdown() has finished (a daemon's Run).
  virtual void Wait() = 0;
  // Stops the gRPC server; watch streams, waiting barriers and CreateTable
  // calls end promptly (barriers and CreateTable with kUnavailable).
  // Idempotent; a concurrent caller returns once the first has finished.
  virtual void Shutdown() = 0;
  // A copy of the current (published) map.
  virtual proto::ClusterMap CurrentMap() const = 0;
  // The scheduler is stopping (SIGTERM, with the whole job): no range
  // moves any more. Drains are called off and later ones refused
  // (kUnavailable: a server then stops as it would without draining),
  // moves under way are cancelled, so that the last checkpoint sees the
  // ranges still.
  virtual void StopMoving() = 0;
  // Takes a checkpoint now and waits until it is complete (its manifest
  // written) or failed; as the Checkpoint RPC. kFailedPrecondition without
  // state_dir or while a restore runs; kDeadlineExceeded after `timeout`.
  // `lbfgs` (a Sandblaster coordinator's state, or empty) goes into the
  // manifest as is.
  virtual absl::StatusOr<proto::CheckpointManifest> Checkpoint(
      absl::Duration timeout, const proto::LbfgsState& lbfgs) = 0;
};

}  // namespace downpour

#endif  // DOWNPOUR_SCHEDULER_SCHEDULER_H_
