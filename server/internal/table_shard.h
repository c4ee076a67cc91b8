// The part of one table that a server holds: its owned key ranges, the
// values, and the update handler's per-row state.
//
// Dense tables keep each owned range as one contiguous array (values take
// exactly rows * width floats; handler state is allocated on the first
// push). Sparse tables keep rows in fixed-size chunks indexed by a hash map,
// so growth never copies or doubles the values already stored.
//
// Zero-copy reads: PinRange hands out rows of a dense table's parameters
// for a reply to reference while the transport sends it. Until the reply
// releases its pin, a write to any pinned row waits (so a reply is never
// torn and no acknowledged update is lost); after a writer had to wait, the
// shard copies its replies for a while instead (PinOptions). A pin that
// outlives PinOptions::wait (a peer that stopped reading) makes the writer
// move the range to a fresh copy of the array and go on (copy-on-write);
// the old array lives until its last pin is released.
//
// Not thread-safe: a shard is used by one data thread at a time, except
// that a pin's release may run on any thread. Stats are atomics and may be
// read from any thread.
#ifndef DOWNPOUR_SERVER_INTERNAL_TABLE_SHARD_H_
#define DOWNPOUR_SERVER_INTERNAL_TABLE_SHARD_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/base/thread_annotations.h"
#include "absl/functional/function_ref.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "common/types.h"
#include "consistency/consistency.h"
#include "handlers/handler.h"
#include "handlers/initializer.h"
#include "handlers/plugin_registry.h"
#include "handlers/vector_kernel.h"
#include "proto/downpour.pb.h"

namespace downpour {
namespace server_internal {

struct KeyRange {
  Key begin;
  Key end;  // exclusive
  bool Contains(Key k) const { return k >= begin && k < end; }
};

// How dense range reads are shared with the transport without copying.
struct PinOptions {
  // Replies of at least this many bytes reference the table (smaller ones
  // are cheaper to copy than to pin).
  size_t min_bytes = size_t{256} << 10;
  // How long a writer waits for pins on its rows before copying the array.
  absl::Duration wait = absl::Seconds(1);
  // After a writer waited, replies are copied for this long: a workload that
  // mixes writes with reads of the same rows pays a copy, not a wait.
  absl::Duration copy_after_wait = absl::Seconds(1);
};

class TableShard {
 public:
  // kInvalidArgument / kNotFound for a bad handler or initializer spec.
  static absl::StatusOr<std::unique_ptr<TableShard>> Create(
      const proto::TableSpec& spec, std::vector<KeyRange> owned,
      const PluginRegistry* plugins, const PinOptions& pin_options = {});

  const proto::TableSpec& spec() const { return spec_; }
  size_t width() const { return width_; }
  const std::vector<KeyRange>& owned() const { return owned_; }
  // The table's whole key space, [0, num_keys) or [0, kKeySpaceEnd).
  KeyRange key_space() const { return key_space_; }
  // Index of the owned range holding `key`, or -1.
  int FindRange(Key key) const;

  // Named vectors over the key ranges (TableSpec.vectors): at least 1, the
  // parameters; dense tables only.
  uint32_t num_vectors() const { return num_vectors_; }

  // Batch operations on vector `vector` (0: the parameters). REQUIRES:
  // every key is owned (FindRange >= 0), vector < num_vectors(), and spans
  // have keys.size() * width() floats. Keys may repeat; repeats apply in
  // order. Vectors other than 0 start as zeros.
  void Put(absl::Span<const Key> keys, const float* values, uint32_t vector = 0);
  void Add(absl::Span<const Key> keys, const float* values, uint32_t vector = 0);
  void Push(absl::Span<const Key> keys, const float* grads);
  // Absent sparse rows read as their initial values and are not created.
  void Get(absl::Span<const Key> keys, float* out, uint32_t vector = 0);

  // Range operations over [begin, end). REQUIRES: the range lies inside one
  // owned range.
  void PutRange(Key begin, Key end, const float* values, uint32_t vector = 0);
  void AddRange(Key begin, Key end, const float* values, uint32_t vector = 0);
  void PushRange(Key begin, Key end, const float* grads);
  void GetRange(Key begin, Key end, float* out, uint32_t vector = 0);

  // Parameter rows [begin, end) for a reply to send without copying.
  // `release` must run exactly once (on any thread) when the transport no
  // longer reads `data`; until then writes to these rows wait. The memory
  // stays valid until then even if the shard is destroyed. Returns nullopt
  // when the reply should be copied instead: a sparse table, fewer than
  // PinOptions::min_bytes, or a writer waited recently. REQUIRES: the range
  // lies inside one owned range.
  struct PinnedRows {
    const float* data;
    size_t bytes;
    std::function<void()> release;
  };
  std::optional<PinnedRows> PinRange(Key begin, Key end);
  // Pins not yet released, over all ranges (for tests and stats).
  int64_t pinned_replies() const;
  uint64_t zero_copy_replies() const {
    return zero_copy_replies_.load(std::memory_order_relaxed);
  }
  uint64_t pin_waits() const { return pin_waits_.load(std::memory_order_relaxed); }
  uint64_t pin_copies() const { return pin_copies_.load(std::memory_order_relaxed); }

  // Runs a vector command (built from `cmd` for num_vectors()) on every
  // owned row in [cmd.begin, cmd.end) and adds its dot products to
  // `partials` (kernel.num_dots() doubles), owned ranges in key order. A
  // ZERO with open_round opens that accumulation round on its vector.
  void RunVectorCommand(const proto::VectorCommand& cmd,
                        const VectorKernel& kernel, double* partials);

  // Exactly-once task accumulation (DataHeader.round > 0). kFailedPrecondition
  // if `round` is newer than the round open on `vector` (the coordinator
  // has not opened it here yet).
  absl::Status CheckRound(uint32_t vector, int64_t round) const;
  // Whether an ADD of `task` whose first key is `first_key` should be
  // applied: false for a round older than the open one (late) or a repeat
  // in it (a backup copy, or a resend). Records the ADD as applied.
  bool FirstInRound(uint32_t vector, int64_t round, uint64_t task,
                    Key first_key);
  uint64_t dropped_task_adds() const {
    return dropped_task_adds_.load(std::memory_order_relaxed);
  }

  // Synchronous (BSP) push of a range by worker `rank` for iteration
  // `clock` (spec().sync_workers() > 0). The gradient is held until
  // sync_workers distinct workers pushed the same range and clock, then
  // their mean, summed in rank order, is applied once. With sync_workers =
  // 1 it is applied at once, without the aggregation copy.
  // `waiter` != 0 names a request that wants the values once that step is
  // applied (BSP PushPull): on kHeld it is remembered with the step, and
  // the kApplied call that completes the step appends every remembered
  // waiter of it to `*released` (the completing request itself is not
  // added: its caller answers it directly). REQUIRES: the range lies inside
  // one owned range; rank < tracked ranks; `released` non-null.
  enum class SyncResult { kHeld, kApplied, kDiscarded };
  SyncResult PushSynced(Key begin, Key end, int rank, Clock clock,
                        const float* grads, uint64_t waiter,
                        std::vector<uint64_t>* released);
  // The same for a batch of keys (sparse tables): every worker sends each
  // server one batch per clock, possibly empty, so that the server can
  // count ranks. Held per clock over this server's whole part of the
  // table; when sync_workers ranks have pushed, each key's gradients are
  // summed in rank order (a rank's repeats in its order), divided by the
  // number of ranks, and the handler applies the mean once per key, keys
  // ascending: the result does not depend on arrival order. Push only (no
  // waiters). REQUIRES: sparse table; every key owned; rank < tracked ranks.
  SyncResult PushSyncedKeys(absl::Span<const Key> keys, int rank, Clock clock,
                            const float* grads);
  // An asynchronous push by `rank` at `clock` was applied (for staleness).
  void RecordApplied(int rank, Clock clock);
  // Staleness of a pull at `clock` (0 when workers are not tracked).
  Clock ObservePull(Clock clock);
  // Ranks a request may carry: max(num_workers, sync_workers).
  int tracked_ranks() const { return tracked_ranks_; }

  uint64_t rows() const { return rows_.load(std::memory_order_relaxed); }
  Clock max_staleness() const { return max_staleness_.load(std::memory_order_relaxed); }
  uint64_t tracked_pulls() const { return tracked_pulls_.load(std::memory_order_relaxed); }
  uint64_t discarded_pushes() const { return discarded_.load(std::memory_order_relaxed); }
  uint64_t aggregated_steps() const { return aggregated_.load(std::memory_order_relaxed); }
  uint64_t value_bytes() const;
  uint64_t state_bytes() const;
  uint64_t allocated_bytes() const;

 private:
  TableShard(const proto::TableSpec& spec, std::vector<KeyRange> owned,
             std::unique_ptr<UpdateHandler> handler, Initializer init,
             const PinOptions& pin_options);

  // A dense range's parameters, shared with the replies that pin its rows.
  struct PinnedArray {
    explicit PinnedArray(size_t floats) : data(new float[floats]) {}
    // A raw array rather than a vector: a vector would zero every page
    // before the initializer writes it again, and fresh pages are slow.
    const std::unique_ptr<float[]> data;
    absl::Mutex mu;
    // Row intervals [first, last) (from the range's start) that replies in
    // flight reference; one entry per pin.
    std::vector<std::pair<size_t, size_t>> pins ABSL_GUARDED_BY(mu);
    // pins.size(), readable without the lock: writers skip the lock when 0.
    std::atomic<int64_t> num_pins{0};
  };

  struct DenseRange {
    KeyRange range;
    // Vector 0; replaced by a copy when a pin outlives PinOptions::wait.
    std::shared_ptr<PinnedArray> values;
    std::unique_ptr<float[]> state;  // null until the first push
    // Named vectors 1, 2, ...: each null until first touched.
    std::vector<std::unique_ptr<float[]>> vectors;
    size_t rows() const { return range.end - range.begin; }
  };
  // Sparse rows live in chunks of kChunkRows rows.
  static constexpr size_t kChunkRows = 1024;
  struct SparseRow {
    float* values;
    float* state;
  };

  float* DenseRow(Key key, float** state, uint32_t vector = 0);
  DenseRange* DenseRangeOf(Key key);
  // Call before writing rows [begin, end) of `r`'s parameters (vector 0):
  // waits for pins on them, or copies the array (see PinOptions::wait).
  void PrepareWrite(DenseRange* r, Key begin, Key end);
  // The same for every range a batch of keys touches (vector 0 only).
  void PrepareBatchWrite(absl::Span<const Key> keys, uint32_t vector);
  float* VectorData(DenseRange* r, uint32_t vector);
  void EnsureDenseState(DenseRange* r);
  SparseRow SparseFind(Key key);  // values == nullptr when absent
  SparseRow SparseTouch(Key key);  // creates the row if absent
  void UpdateAccounting();

  const proto::TableSpec spec_;
  const size_t width_;
  const std::vector<KeyRange> owned_;
  const KeyRange key_space_;
  const std::unique_ptr<UpdateHandler> handler_;
  const size_t state_width_;
  const Initializer init_;
  const bool dense_;
  const uint32_t num_vectors_;
  const PinOptions pin_options_;
  absl::Time copy_replies_until_ = absl::InfinitePast();
  // Pins not yet released over all arrays, shared with the release
  // callbacks (which may outlive the shard).
  const std::shared_ptr<std::atomic<int64_t>> live_pins_ =
      std::make_shared<std::atomic<int64_t>>(0);
  std::atomic<uint64_t> zero_copy_replies_{0};
  std::atomic<uint64_t> pin_waits_{0};
  std::atomic<uint64_t> pin_copies_{0};

  std::vector<DenseRange> dense_ranges_;
  // Sparse storage.
  absl::flat_hash_map<Key, uint32_t> index_;
  std::vector<std::unique_ptr<float[]>> value_chunks_;
  std::vector<std::unique_ptr<float[]>> state_chunks_;
  uint32_t sparse_rows_ = 0;

  // BSP aggregation, per (range, clock); key batches use the whole key
  // space as their range.
  struct HeldPush {
    bool pushed = false;
    std::vector<Key> keys;  // key batches only
    std::vector<float> grads;
  };
  struct PendingStep {
    std::vector<HeldPush> by_rank;
    int count = 0;
    std::vector<uint64_t> waiters;  // PushPull requests to answer
  };
  // What PushSynced and PushSyncedKeys share: drops a push of a step
  // already applied; with sync_workers = 1 runs `apply_alone` (if given)
  // straight from the request; otherwise holds the push (a resend is
  // ignored) and once sync_workers ranks have pushed, runs `apply` on the
  // held step, releases its waiters and closes it.
  SyncResult HoldSynced(KeyRange part, int rank, Clock clock,
                        absl::Span<const Key> keys, const float* grads,
                        size_t num_floats, uint64_t waiter,
                        std::vector<uint64_t>* released,
                        const std::function<void()>& apply_alone,
                        absl::FunctionRef<void(const PendingStep&)> apply);
  // Gradient copies and the sum are reused across steps: allocating 800 KB
  // per step would write fresh pages, ~40x slower than reused ones here.
  std::vector<float> TakeSpare();
  std::vector<std::vector<float>> spare_;
  std::vector<float> sum_;
  const int tracked_ranks_;
  std::map<std::tuple<Key, Key, Clock>, PendingStep> pending_;
  std::map<std::pair<Key, Key>, Clock> next_clock_;  // first clock not applied
  StalenessTracker staleness_;

  // Exactly-once accumulation, per vector: the open round and the
  // (task, first key) pairs already applied in it.
  struct Round {
    int64_t open = 0;
    absl::flat_hash_set<std::pair<uint64_t, Key>> applied;
  };
  std::vector<Round> rounds_;
  std::atomic<uint64_t> dropped_task_adds_{0};

  std::atomic<Clock> max_staleness_{0};
  std::atomic<uint64_t> tracked_pulls_{0};
  std::atomic<uint64_t> discarded_{0};
  std::atomic<uint64_t> aggregated_{0};
  std::atomic<uint64_t> rows_{0};
  std::atomic<uint64_t> allocated_bytes_{0};
  std::atomic<uint64_t> state_bytes_{0};
};

}  // namespace server_internal
}  // namespace downpour

#endif  // DOWNPOUR_SERVER_INTERNAL_TABLE_SHARD_H_
