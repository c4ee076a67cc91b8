// Validates data-plane requests and executes them on the table shards; on a
// primary, hands writes to the Replicator so that they are acknowledged
// only once every backup holds them; on a backup, applies what the primary
// forwards.
//
// Handle runs each client request in two stages: Validate checks everything
// and resolves the request into a plain struct (the table, the one range it
// touches, its keys and values), changing nothing; Apply then executes it
// and cannot fail. So a rejected request leaves the tables as they were.
// Error codes:
//   kInvalidArgument   unknown operation, wrong width, key count or value
//                      length that disagree, keys sent with a range op, a
//                      request whose keys lie in two ranges
//   kNotFound          unknown table (and the server is not behind)
//   kOutOfRange        a key outside the table's key space
//   kAborted           a key this server does not serve as primary: "not
//                      owner, epoch N"; the client refreshes its map and
//                      retries (also a held write whose range moved away)
//   kUnavailable       the request comes from a newer epoch than the server
//                      has applied, or writes to a range being handed to
//                      another server (RangeAssignment.handing_to); retry
//                      shortly
//   kDataLoss          the range was lost (no live server held its data
//                      when it was assigned here)
//   kResourceExhausted a reply that would exceed the message limit
//   kFailedPrecondition a task ADD for a round not yet open on its vector
// BSP (a clocked PUSH or PUSH_PULL on a table with sync_workers > 0): the
// reply comes once the step's update has been applied (PUSH_PULL's with the
// new values). If this request completes the step (or was discarded as
// late) the reply is immediate; otherwise it is deferred, and the request
// that completes the step releases it.
// Exactly once: a write carrying a client id and sequence number that the
// range has applied already (a retry) is acknowledged without applying it
// again (a VECTOR command gets its first answer; a PUSH_PULL the current
// values).
// VECTOR (server-side algebra) runs on the rows this server serves as
// primary in the command's range, and every key of that range must be in
// one: a part it does not serve (yet: it has not applied the map that
// promotes it; or any more) is refused as not owned (kAborted, or
// kUnavailable from a newer epoch), so that the client sends it again
// instead of counting it done with nothing applied.
//
// Implemented in dispatcher.cc (executing requests), dispatcher_validate.cc
// (checking them), dispatcher_map.cc (map changes) and replica_apply.cc (a
// backup applying its primary's stream).
//
// Thread-compatible: Handle, InstallMap and ApplyMap run on the data
// thread; PrepareMap (allocating new ranges) may run on another thread, but
// not concurrently with InstallMap; FillStats on any thread,
// FillReplicationStats on the data thread.
#ifndef DOWNPOUR_SERVER_INTERNAL_DISPATCHER_H_
#define DOWNPOUR_SERVER_INTERNAL_DISPATCHER_H_

#include <array>
#include <atomic>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "common/buffer_pool.h"
#include "common/types.h"
#include "handlers/plugin_registry.h"
#include "handlers/vector_kernel.h"
#include "proto/downpour.pb.h"
#include "server/internal/replicator.h"
#include "server/internal/table_shard.h"
#include "transport/frames.h"

namespace downpour {
namespace server_internal {

class Dispatcher {
 public:
  // `pool` and `plugins` must outlive the dispatcher, and `env` too unless
  // it is null (no replication: ranges with backups then fail their writes
  // with kFailedPrecondition). Large range reads of dense parameters are
  // sent from the table without copying (see RangeStore::PinRows).
  // `max_table_bytes` (0: no limit) bounds the table storage this server
  // takes on: see PrepareMap.
  // `cold_store` (null: none) holds the cold tiers of bounded sparse
  // tables; it must outlive the dispatcher.
  Dispatcher(NodeId self, size_t max_message_bytes, BufferPool* pool,
             const PluginRegistry* plugins, const PinOptions& pin_options = {},
             ReplicationEnv* env = nullptr, uint64_t max_table_bytes = 0,
             storage::ColdStore* cold_store = nullptr);

  // A map with what applying it needs allocated already.
  struct PreparedMap {
    proto::ClusterMap map;
    absl::flat_hash_map<TableId, std::shared_ptr<TableShard>> new_tables;
    // Fresh ranges for this server, by (table, first key).
    std::map<std::pair<TableId, Key>, std::unique_ptr<TableShard::Range>> fresh;
    absl::Status status;  // the first table that could not be built
    // Every table this server cannot create or hold, with why (the
    // scheduler hears of them with the epoch's acknowledgement).
    std::vector<std::pair<TableId, absl::Status>> failures;
    // Ranges (table, first key) assigned here that it refused for lack of
    // memory: InstallMap leaves them out.
    std::set<std::pair<TableId, Key>> refused;
  };
  // Builds the shards of new tables and the stores of ranges new to this
  // server (the slow part: a dense range is written once by its
  // initializer). Tables whose spec cannot be built are reported in the
  // returned map's status and failures, and left out. Memory is checked
  // before anything is allocated: the map's tables, in map order (older
  // tables first), are counted at what their ranges here hold once used
  // (dense: rows x (width x vectors + handler state) floats; sparse: what
  // they hold now); a table whose new ranges would take the total past
  // max_table_bytes gets none of them (kResourceExhausted naming the
  // table, this server and the limit), and an allocation that fails
  // (std::bad_alloc) is refused the same way, rather than the server
  // dying.
  std::unique_ptr<PreparedMap> PrepareMap(const proto::ClusterMap& map) const
      ABSL_LOCKS_EXCLUDED(mu_);
  // Makes the prepared map current: creates, promotes, demotes and drops
  // ranges, sets their backups, and records the epoch. Returns the first
  // error PrepareMap met (the rest is still applied).
  absl::Status InstallMap(std::unique_ptr<PreparedMap> prepared)
      ABSL_LOCKS_EXCLUDED(mu_);
  // PrepareMap then InstallMap, on the calling thread.
  absl::Status ApplyMap(const proto::ClusterMap& map) ABSL_LOCKS_EXCLUDED(mu_);
  Epoch epoch() const ABSL_LOCKS_EXCLUDED(mu_);

  // Executes one request and fills the reply (status fields on error), or
  // sets reply->deferred (a BSP push waiting for its step, or a write
  // waiting for its backups). Replies of earlier deferred requests that
  // this one releases are appended to `*released`; the caller sends them.
  // REQUIRES: `released` non-null.
  void Handle(const IncomingMessage& request, OutgoingReply* reply,
              std::vector<DeferredReply>* released) ABSL_LOCKS_EXCLUDED(mu_);

  // Counters and per-table figures.
  // Bounded sparse tables: idle rows of the ranges this server serves as
  // primary expire (TTL), a bounded number per range, and the backups are
  // told (EVICT). Call on the data thread between requests.
  void ExpireIdle();
  void FillStats(proto::ServerStats* stats) const ABSL_LOCKS_EXCLUDED(mu_);
  // The replication figures, which the data thread keeps without atomics.
  // REQUIRES: called on the data thread.
  void FillReplicationStats(proto::ServerStats* stats) const;
  // Fault injection (tests, drills): copies to new backups send at most
  // one chunk per `delay` (Replicator::set_copy_delay). Before serving.
  void InjectCopyDelay(absl::Duration delay) {
    if (replicator_ != nullptr) replicator_->set_copy_delay(delay);
  }
  // Fault injection (tests): the replicator's gates (Replicator::Gates)
  // hold the moves from or to the server named `node`, or every copy and
  // handover if it is empty. Before serving.
  void InjectGates(Replicator::Gates gates, std::string node) {
    if (replicator_ == nullptr) return;
    replicator_->set_gates(std::move(gates));
    gated_node_ = std::move(node);
  }
  // Each range served as primary: its size and what it served
  // (proto::RangeLoad). REQUIRES: called on the data thread.
  void FillRangeLoads(
      google::protobuf::RepeatedPtrField<proto::RangeLoad>* out) const;

  // The tables held here, by id (for checkpoints, restores and export). On
  // the data thread their ranges may be read and changed; other threads may
  // only keep the pointers.
  std::vector<std::pair<TableId, std::shared_ptr<TableShard>>> Tables() const
      ABSL_LOCKS_EXCLUDED(mu_);

 private:
  // A request that passed every check, resolved to what Apply needs.
  struct Validated {
    proto::Op op = proto::OP_UNSPECIFIED;
    std::shared_ptr<TableShard> shard;
    // The one range the request touches (nullptr for VECTOR, which runs on
    // every range it overlaps that this server serves as primary).
    TableShard::Range* range = nullptr;
    bool is_range = false;
    Key begin = 0, end = 0;  // is_range
    // A synced key batch: the stretch of `range` it speaks for (its named
    // range, between step cuts), else the whole range.
    KeyRange stretch{0, 0};
    absl::Span<const Key> keys;  // !is_range
    uint64_t n = 0;              // keys
    size_t floats = 0;           // n * width
    uint32_t vector = 0;
    const float* values = nullptr;  // writes
    // The request carries a tracked worker clock and rank.
    bool clocked = false;
    // A clocked push to a table that aggregates synchronously (BSP).
    bool synced = false;
    // A write the client may retry: (client id, seq) recorded per range.
    bool deduped = false;
    std::optional<VectorKernel> kernel;  // VECTOR
  };

  absl::StatusOr<Validated> Validate(const IncomingMessage& request) const
      ABSL_LOCKS_EXCLUDED(mu_);
  absl::StatusOr<Validated> ValidateVector(
      Validated v, const IncomingMessage& request) const;
  // Executes a validated request. Writes that the ranges' backups must
  // apply too are appended to `forwards` (also when it fails: what a
  // bounded table moved before). Fails only for a write a bounded sparse
  // table refuses whole (kResourceExhausted: nothing changed) and a read
  // its cold tier fails.
  absl::Status Apply(const Validated& v, const IncomingMessage& request,
                     OutgoingReply* reply, std::vector<DeferredReply>* released,
                     std::vector<ForwardedWrite>* forwards);
  absl::Status ApplySynced(const Validated& v, const IncomingMessage& request,
                           OutgoingReply* reply,
                           std::vector<DeferredReply>* released,
                           std::vector<ForwardedWrite>* forwards);
  // What a bounded sparse range's preparation moved (SparseRows::Room), as
  // the backups must apply it before the write: EVICT of the keys that
  // left memory, COPY_ROWS of the rows brought back from the cold tier.
  // Nothing without backups.
  void ForwardRoom(const TableShard& shard, TableShard::Range* range,
                   const SparseRows::Room& room,
                   std::vector<ForwardedWrite>* forwards);
  // A BSP step just applied to the part [begin, end) of `range` (sparse:
  // to the range's key batches, applied_keys_) at `clock`: what its backups
  // apply. `applied`: the gradient the handler applied; `own`: the request
  // whose gradient that is (one rank), sent without a copy, or null.
  ForwardedWrite StepForward(TableShard& shard, TableShard::Range* range,
                             Key begin, Key end, Clock clock,
                             const float* applied, const IncomingMessage* own);
  // The replies of the requests the step released, waiters_[first_waiter..]
  // (a PushPull's with the values step `next` reads), appended to
  // `released`; `replicated`: the replies wait for the backups, so they
  // copy rather than pin the rows.
  // A step refused at a bounded table's cap (`status` not OK) answers every
  // waiter with that error.
  void ReleaseStepWaiters(TableShard& shard, TableShard::Range& range,
                          Key begin, Key end, uint64_t n, Clock next,
                          bool replicated, size_t first_waiter,
                          const absl::Status& status,
                          std::vector<DeferredReply>* released);
  // The job went on without `ranks` (ClusterMap.retired_ranks): the BSP
  // steps of `shard` held for them are applied now, forwarded to the
  // backups and answered; their own held pushes are answered with
  // kFailedPrecondition.
  void RetireRanks(TableShard& shard, absl::Span<const int> ranks, Epoch epoch);
  // Sends each of `tokens` the error `why` (nothing without an env).
  void AnswerWithError(const std::vector<uint64_t>& tokens,
                       const absl::Status& why);
  // Runs a VECTOR command on the primary ranges it overlaps; their partial
  // dot products, each range's kept in `per_range` (for its client ledger).
  void ApplyVector(
      const Validated& v, const IncomingMessage& request, OutgoingReply* reply,
      std::vector<ForwardedWrite>* forwards,
      std::vector<std::pair<TableShard::Range*, std::vector<double>>>*
          per_range);
  // A retry of a write this range applied already.
  void AnswerRetry(const Validated& v, const IncomingMessage& request,
                   const std::vector<double>& scalars, OutgoingReply* reply);
  // The forwarded form of a client write (its header, its frames).
  ForwardedWrite ForwardOf(const Validated& v, const IncomingMessage& request);
  bool Replicated(const Validated& v) const;
  bool Replicated(const TableShard& shard,
                  const TableShard::Range& range) const;
  // Backup side: a message from the range's primary (checked here,
  // applied by ApplyReplicated).
  void HandleReplica(const IncomingMessage& request, OutgoingReply* reply);
  // The values of [begin, end) of `vector`: the table's own rows, pinned
  // until sent, when the store allows it (large ranges of the parameters)
  // and `may_pin`, else a copy in a pooled buffer.
  Payload ReadRange(RangeStore& store, Key begin, Key end, size_t floats,
                    uint32_t vector = 0, bool may_pin = true);
  std::shared_ptr<TableShard> Lookup(TableId id, Epoch* epoch) const
      ABSL_LOCKS_EXCLUDED(mu_);
  // Answers the BSP pushes waiting on a range that leaves this server.
  void AbandonSteps(TableShard::Range& range, const absl::Status& why);
  // Ranges held here that the map lists as pieces this server holds (a
  // split, RangeAssignment.split_at) are cut in place (range_split.h).
  void SplitHeldRanges(TableId id, TableShard& shard,
                       const proto::TableMap& table, Epoch epoch);
  // Neighbours held here that the map lists as one range this server holds
  // in sync (a merge, RangeAssignment.merge) are joined in place.
  void MergeHeldRanges(TableId id, TableShard& shard,
                       const proto::TableMap& table, Epoch epoch);
  // Stops holding `range` of table `id`: its replication streams end and
  // its held BSP pushes are answered with `why`.
  void DropRange(TableId id, TableShard& shard, TableShard::Range& range,
                 const absl::Status& why);

  const NodeId self_;
  const size_t max_message_bytes_;
  BufferPool* const pool_;
  const PluginRegistry* const plugins_;
  const PinOptions pin_options_;
  ReplicationEnv* const env_;
  const uint64_t max_table_bytes_;          // 0: no limit
  storage::ColdStore* const cold_store_;    // null: no cold tiers
  std::unique_ptr<Replicator> replicator_;  // null without env
  std::string gated_node_;                  // InjectGates

  mutable absl::Mutex mu_;
  Epoch epoch_ ABSL_GUARDED_BY(mu_) = 0;
  absl::flat_hash_map<TableId, std::shared_ptr<TableShard>> tables_
      ABSL_GUARDED_BY(mu_);

  // Data thread only: scratch for the waiters a BSP step releases, and the
  // keys a synced sparse step applied.
  std::vector<uint64_t> waiters_;
  std::vector<Key> applied_keys_;
  // What a bounded table's write preparation moved (ForwardRoom).
  SparseRows::Room room_;
  // Held BSP requests that want the step's values (PushPulls), by token.
  absl::flat_hash_set<uint64_t> pull_waiters_;

  std::array<std::atomic<uint64_t>, 8> requests_by_op_{};
  std::atomic<uint64_t> errors_{0};
  std::atomic<uint64_t> retries_answered_{0};
  std::atomic<uint64_t> replica_writes_{0};
};

}  // namespace server_internal
}  // namespace downpour

#endif  // DOWNPOUR_SERVER_INTERNAL_DISPATCHER_H_
