// Validates data-plane requests and executes them on the table shards.
//
// Handle runs each request in two stages: Validate checks everything and
// resolves the request into a plain struct (the table, the one range it
// touches, its keys and values), changing nothing; Apply then executes it
// and cannot fail. So a rejected request leaves the tables as they were.
// Error codes:
//   kInvalidArgument   unknown operation, wrong width, key count or value
//                      length that disagree, keys sent with a range op, a
//                      request whose keys lie in two ranges
//   kNotFound          unknown table (and the server is not behind)
//   kOutOfRange        a key outside the table's key space
//   kAborted           a key this server does not hold: "not owner, epoch N";
//                      the client refreshes its map and retries
//   kUnavailable       the request comes from a newer epoch than the server
//                      has applied; retry shortly
//   kResourceExhausted a reply that would exceed the message limit
//   kFailedPrecondition a task ADD for a round not yet open on its vector
// BSP PushPull (a clocked PUSH_PULL of a key range on a table with
// sync_workers > 0): the reply carries the values once the step's update
// has been applied. If this request completes the step (or was discarded as
// late) the reply is immediate; otherwise it is deferred, and the request
// that completes the step releases it (see Handle).
// VECTOR (server-side algebra) runs on the held rows only; ranges it names
// beyond them are not an error, since every holder gets the same command.
//
// Thread-safe: ApplyMap runs on the map watcher's thread while Handle runs on
// the data thread.
#ifndef DOWNPOUR_SERVER_INTERNAL_DISPATCHER_H_
#define DOWNPOUR_SERVER_INTERNAL_DISPATCHER_H_

#include <array>
#include <atomic>
#include <memory>
#include <optional>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "common/buffer_pool.h"
#include "common/types.h"
#include "handlers/plugin_registry.h"
#include "handlers/vector_kernel.h"
#include "proto/downpour.pb.h"
#include "server/internal/table_shard.h"
#include "transport/frames.h"

namespace downpour {
namespace server_internal {

class Dispatcher {
 public:
  // `pool` and `plugins` must outlive the dispatcher. Large range reads of
  // dense parameters are sent from the table without copying (see
  // RangeStore::PinRows and `pin_options`).
  Dispatcher(NodeId self, size_t max_message_bytes, BufferPool* pool,
             const PluginRegistry* plugins,
             const PinOptions& pin_options = {});

  // Creates shards for tables new in `map` (with the ranges this node owns;
  // possibly none) and records its epoch. Tables already known keep their
  // data. Returns the first error of a table that could not be created (the
  // others are still applied).
  absl::Status ApplyMap(const proto::ClusterMap& map) ABSL_LOCKS_EXCLUDED(mu_);
  Epoch epoch() const ABSL_LOCKS_EXCLUDED(mu_);

  // Executes one request and fills the reply (status fields on error), or
  // sets reply->deferred (BSP PushPull waiting for its step). Replies of
  // earlier deferred requests that this one releases are appended to
  // `*released`; the caller sends them. REQUIRES: `released` non-null.
  void Handle(const IncomingMessage& request, OutgoingReply* reply,
              std::vector<DeferredReply>* released) ABSL_LOCKS_EXCLUDED(mu_);

  // Counters and per-table figures.
  void FillStats(proto::ServerStats* stats) const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  // A request that passed every check, resolved to what Apply needs.
  struct Validated {
    proto::Op op = proto::OP_UNSPECIFIED;
    std::shared_ptr<TableShard> shard;
    // The one range the request touches (nullptr for VECTOR, which runs on
    // every held range it overlaps).
    TableShard::Range* range = nullptr;
    bool is_range = false;
    Key begin = 0, end = 0;         // is_range
    absl::Span<const Key> keys;     // !is_range
    uint64_t n = 0;                 // keys
    size_t floats = 0;              // n * width
    uint32_t vector = 0;
    const float* values = nullptr;  // writes
    // The request carries a tracked worker clock and rank.
    bool clocked = false;
    // A clocked push to a table that aggregates synchronously (BSP).
    bool synced = false;
    std::optional<VectorKernel> kernel;  // VECTOR
  };

  absl::StatusOr<Validated> Validate(const IncomingMessage& request) const
      ABSL_LOCKS_EXCLUDED(mu_);
  absl::StatusOr<Validated> ValidateVector(Validated v,
                                           const IncomingMessage& request)
      const;
  // Executes a validated request. Cannot fail.
  void Apply(const Validated& v, const IncomingMessage& request,
             OutgoingReply* reply, std::vector<DeferredReply>* released);
  void ApplySynced(const Validated& v, const IncomingMessage& request,
                   OutgoingReply* reply, std::vector<DeferredReply>* released);
  void ApplyVector(const Validated& v, const IncomingMessage& request,
                   OutgoingReply* reply);
  // The values of [begin, end) of `vector`: the table's own rows, pinned
  // until sent, when the store allows it (large ranges of the parameters),
  // else a copy in a pooled buffer.
  Payload ReadRange(RangeStore& store, Key begin, Key end, size_t floats,
                    uint32_t vector = 0);
  std::shared_ptr<TableShard> Lookup(TableId id, Epoch* epoch) const
      ABSL_LOCKS_EXCLUDED(mu_);

  const NodeId self_;
  const size_t max_message_bytes_;
  BufferPool* const pool_;
  const PluginRegistry* const plugins_;
  const PinOptions pin_options_;

  mutable absl::Mutex mu_;
  Epoch epoch_ ABSL_GUARDED_BY(mu_) = 0;
  absl::flat_hash_map<TableId, std::shared_ptr<TableShard>> tables_
      ABSL_GUARDED_BY(mu_);

  // Data thread only: scratch for the waiters a BSP step releases, and the
  // keys a synced sparse step applied.
  std::vector<uint64_t> waiters_;
  std::vector<Key> applied_keys_;

  std::array<std::atomic<uint64_t>, 8> requests_by_op_{};
  std::atomic<uint64_t> errors_{0};
};

}  // namespace server_internal
}  // namespace downpour

#endif  // DOWNPOUR_SERVER_INTERNAL_DISPATCHER_H_
