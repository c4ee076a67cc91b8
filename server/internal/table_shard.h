// The part of one table that a server holds: the table's layout and the key
// ranges of it on this server, each a RangeStore (the rows) with the
// protocol state that lives beside its rows: BSP steps being aggregated
// (StepAggregator) and Sandblaster task rounds (RoundLedger). The table's
// staleness bookkeeping (StalenessTracker) spans its ranges.
//
//   auto shard = TableShard::Create(spec, {{0, 500}}, &plugins);
//   TableShard::Range* r = (*shard)->Find(key);   // nullptr: not held here
//   r->store.Push(keys, grads);
//
// BSP glue: PushSynced / PushSyncedKeys hold a worker's gradient in the
// range's StepAggregator and, when the step's last rank arrives, apply the
// mean of the ranks' gradients (summed in rank order, so the result does
// not depend on arrival order) to the range's rows once.
//
// Not thread-safe: a shard is used by one data thread at a time (pins are
// released from any thread; see RangeStore). Counters are atomics and may
// be read from any thread.
#ifndef DOWNPOUR_SERVER_INTERNAL_TABLE_SHARD_H_
#define DOWNPOUR_SERVER_INTERNAL_TABLE_SHARD_H_

#include <array>
#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"
#include "common/types.h"
#include "consistency/consistency.h"
#include "consistency/step_aggregator.h"
#include "handlers/plugin_registry.h"
#include "proto/downpour.pb.h"
#include "server/internal/client_ledger.h"
#include "server/internal/range_store.h"
#include "server/internal/round_ledger.h"

namespace downpour {
namespace server_internal {

class TableShard {
 public:
  // One range of the table held here, as its primary (serving clients) or
  // as a backup (applying what its primary forwards).
  struct Range {
    enum class Role { kPrimary, kBackup };
    Range(const TableLayout* layout, KeyRange range, int ranks,
          StepCounts needed)
        : store(std::make_unique<RangeStore>(layout, range)),
          rounds(layout->num_vectors),
          ranks_(std::max(1, ranks)),
          needed_(std::move(needed)) {}
    KeyRange range() const { return store->range(); }
    // Distinct ranks that complete each step, for the aggregators made from
    // now on (TableShard updates the existing ones).
    void SetNeeded(StepCounts needed) { needed_ = std::move(needed); }

    // BSP steps (tables with sync_workers > 0) aggregate per part: a key
    // range as the workers push it (they cut a large table into parts the
    // same way), or, for sparse key batches, the stretch of the range
    // between its step cuts that the batch names (the whole range without
    // cuts).
    StepAggregator& StepsFor(KeyRange part) {
      auto it = steps.find({part.begin, part.end});
      if (it == steps.end()) {
        it = steps
                 .emplace(std::make_pair(part.begin, part.end),
                          StepAggregator(ranks_, needed_))
                 .first;
      }
      return it->second;
    }

    // The shard that made it (NewRange; null for a range made alone, in
    // tests): where a copy of the range finds the staleness counts.
    const TableShard* shard = nullptr;
    // Replaced whole when a backup starts a fresh copy of its range.
    std::unique_ptr<RangeStore> store;
    std::map<std::pair<Key, Key>, StepAggregator> steps;
    RoundLedger rounds;
    ClientLedger clients;
    // Where neighbours merged into this range met, for a table that
    // aggregates BSP steps (RangeAssignment.step_cuts, from the applied
    // map): ascending, inside the range. Its steps aggregate apart on
    // either side of each.
    std::vector<Key> step_cuts;
    // The stretch between step cuts named [begin, end), if it is one of
    // the range's (the whole range without cuts).
    bool IsStretch(KeyRange named) const {
      const KeyRange r = range();
      if (named.begin < r.begin || named.end > r.end ||
          named.begin >= named.end) {
        return false;
      }
      if (CrossesCut(named)) return false;
      bool begins = named.begin == r.begin, ends = named.end == r.end;
      for (Key cut : step_cuts) {
        begins |= cut == named.begin;
        ends |= cut == named.end;
      }
      return begins && ends;
    }
    // Whether [begin, end) crosses a step cut.
    bool CrossesCut(KeyRange part) const {
      for (Key cut : step_cuts) {
        if (cut > part.begin && cut < part.end) return true;
      }
      return false;
    }
    Role role = Role::kPrimary;
    NodeId primary = kNoNode;  // the range's primary in the applied map
    int backups = 0;           // backups the map lists for it
    // Being handed to this in-sync backup (RangeAssignment.handing_to):
    // writes are refused until the next map makes it the primary.
    NodeId handing_to = kNoNode;
    // No live server held the range's data when it was assigned here: every
    // operation fails with kDataLoss (RangeAssignment.lost).
    bool lost = false;
    // Client requests served here and the rows they touched (the range's
    // load, proto::RangeLoad); data thread only.
    uint64_t served_requests = 0;
    uint64_t served_keys = 0;
    // One key of each of the last kKeySample requests, each picked by its
    // request's count: their median is where a split halves the range's
    // load (RangeLoad.split_key). Data thread only.
    static constexpr size_t kKeySample = 64;
    std::array<Key, kKeySample> key_sample{};
    void SampleKey(Key k) { key_sample[served_requests % kKeySample] = k; }
    // The median of the sample (0 before any request).
    Key MedianKey() const;

   private:
    int ranks_;
    StepCounts needed_;
  };

  // kInvalidArgument / kNotFound for a bad handler or initializer spec;
  // kFailedPrecondition for a cold tier without `cold_store`. `cold_store`:
  // as TableLayout::Create.
  static absl::StatusOr<std::unique_ptr<TableShard>> Create(
      const proto::TableSpec& spec, const std::vector<KeyRange>& ranges,
      const PluginRegistry* plugins, const PinOptions& pin_options = {},
      storage::ColdStore* cold_store = nullptr);

  const TableLayout& layout() const { return *layout_; }
  const proto::TableSpec& spec() const { return layout_->spec; }
  size_t width() const { return layout_->width; }
  uint32_t num_vectors() const { return layout_->num_vectors; }
  KeyRange key_space() const { return layout_->key_space; }

  // The range holding `key`, or nullptr when this server holds none.
  Range* Find(Key key);
  // The range exactly [range.begin, range.end), or nullptr.
  Range* FindExact(KeyRange range);
  // The held ranges, by begin key.
  const std::map<Key, std::unique_ptr<Range>>& ranges() const {
    return ranges_;
  }
  std::vector<KeyRange> held() const;
  // Starts holding `range` (fresh rows). REQUIRES: it overlaps no held
  // range and lies in the key space.
  Range* AddRange(KeyRange range);
  // A fresh range to hand to AddRange later: allocating a large dense range
  // takes a while, so the map watcher does it off the data thread.
  // Thread-safe.
  std::unique_ptr<Range> NewRange(KeyRange range) const;
  Range* AddRange(std::unique_ptr<Range> range);
  // Stops holding the range that begins at `begin` (if any).
  void RemoveRange(Key begin);

  // Synchronous (BSP) push of [begin, end) by worker `rank` for iteration
  // `clock` (spec().sync_workers() > 0): held until sync_workers distinct
  // ranks pushed the same range and clock, then their mean, summed in rank
  // order, is applied once (with sync_workers = 1 at once, straight from
  // `grads`). `waiter` != 0 names a request that wants an answer once the
  // step is applied: it is remembered on kHeld, and the call that completes
  // the step appends the remembered waiters to `*released` (not its own).
  // REQUIRES: [begin, end) lies in `range`; rank < tracked_ranks().
  enum class SyncResult { kHeld, kApplied, kDiscarded };
  struct SyncOutcome {
    SyncResult result;
    // kApplied: the gradient the handler applied (the ranks' mean, or the
    // request's own with one rank); valid until the next synced push.
    const float* applied = nullptr;
    // kApplied on a bounded sparse table: a step that did not fit in the
    // row cap is closed without changing any row, and every push of it is
    // answered with this error (kResourceExhausted).
    absl::Status status;
  };
  // A bounded sparse range makes room for the rows a step creates first
  // (PrepareWrite): what moved is appended to `room` (may be null for a
  // dense table), for the backups.
  SyncOutcome PushSynced(Range& range, Key begin, Key end, int rank,
                         Clock clock, const float* grads, uint64_t waiter,
                         std::vector<uint64_t>* released,
                         SparseRows::Room* room = nullptr);
  // The same for a batch of keys (sparse tables): every worker sends each
  // stretch of a range (the whole range, or a stretch between its step
  // cuts) one batch per clock, possibly empty, so that the stretch can
  // count ranks. When sync_workers ranks have pushed, each key's gradients
  // are summed in rank order (a rank's repeats in its order), divided by
  // the number of ranks, and the handler applies the mean once per key,
  // keys ascending (then `applied_keys` and `applied` describe that
  // batch). REQUIRES: sparse table; `stretch` one of range.IsStretch's;
  // every key in it.
  SyncOutcome PushSyncedKeys(Range& range, KeyRange stretch,
                             absl::Span<const Key> keys, int rank, Clock clock,
                             const float* grads, uint64_t waiter,
                             std::vector<uint64_t>* released,
                             std::vector<Key>* applied_keys,
                             SparseRows::Room* room = nullptr);

  // Worker ranks the job went on without (ClusterMap.retired_ranks, all of
  // them, ascending). For each rank not retired before: its held BSP
  // pushes are dropped, their waiters appended to `orphans` (to be
  // answered with an error), it no longer counts for staleness, and a
  // step needs min(sync_workers, ranks not retired) pushes from now on.
  // The held steps complete by that count are appended to `complete`, for
  // CompleteStep, clocks ascending within each part. Ranks outside
  // tracked_ranks() are ignored.
  struct HeldStep {
    Range* range;
    KeyRange part;
    Clock clock;
  };
  void Retire(absl::Span<const int> ranks, std::vector<uint64_t>* orphans,
              std::vector<HeldStep>* complete);
  // Ranks from `joined` on are vacant elastic seats (ClusterMap
  // .job_workers, 0: none): left out of the staleness figures until a
  // worker takes them, and then counted from the clock they started at
  // (`seat_starts`, ClusterMap.seat_clocks). A BSP table counts a taken
  // seat's pushes from that clock on: a step needs one more push from each
  // seat's start (StepCounts; see NeededCounts).
  void SetJoinedWorkers(int joined, const std::vector<Clock>& seat_starts);
  bool retired(int rank) const {
    return rank >= 0 && rank < static_cast<int>(retired_.size()) &&
           retired_[rank];
  }
  // Applies a step that Retire found complete, as the push completing it
  // would have (PushSynced, PushSyncedKeys): every waiter it held is
  // appended to `released`.
  SyncOutcome CompleteStep(const HeldStep& step,
                           std::vector<uint64_t>* released,
                           std::vector<Key>* applied_keys,
                           SparseRows::Room* room = nullptr);

  // Bounded sparse tables (TableSpec.bounds), on the range's primary: makes
  // room for a write of `keys` (SparseRows::Prepare), never evicting a row
  // that a held BSP step of another clock than `except` pushed. What moved
  // is appended to `room`. OK at once for other tables.
  absl::Status PrepareWrite(Range& range, absl::Span<const Key> keys,
                            SparseRows::Write write, Clock except,
                            SparseRows::Room* room);
  // The same for the keys [begin, end) of a sparse range.
  absl::Status PrepareWriteRange(Range& range, Key begin, Key end,
                                 SparseRows::Write write, Clock except,
                                 SparseRows::Room* room);
  // The primary's expiry between writes (SparseRows::Expire): at most
  // `max_rows` idle rows of each held primary range leave memory; their
  // keys are appended to `gone`, by range.
  void ExpireIdle(size_t max_rows,
                  std::vector<std::pair<Range*, std::vector<Key>>>* gone);

  // An asynchronous push by `rank` at `clock` was applied (for staleness).
  void RecordApplied(int rank, Clock clock);
  // Staleness of a pull at `clock` (0 when workers are not tracked).
  Clock ObservePull(Clock clock);
  // Per rank, the iterations this server has applied (what staleness is
  // measured against), and taking in another holder's: a range copied
  // here (a move, a new backup) brings its source's counts, so that pulls
  // after the handover are not measured against zero.
  const std::vector<Clock>& AppliedCounts() const {
    return staleness_.applied();
  }
  void MergeApplied(absl::Span<const Clock> counts);
  // Ranks a request may carry: max(num_workers, sync_workers).
  int tracked_ranks() const { return tracked_ranks_; }
  // Distinct ranks that complete each BSP step: min(sync_workers, ranks
  // the job started with that are not retired), plus, from each taken
  // seat's start clock on, that seat unless it retired.
  StepCounts NeededCounts() const;
  // A task ADD was dropped as late or repeated.
  void CountDroppedTaskAdd() {
    dropped_task_adds_.fetch_add(1, std::memory_order_relaxed);
  }

  // The table's figures on this server (any thread): its storage summed
  // over the held ranges, and the shard's own counters. Fills every field
  // of `out` but the id.
  void FillStats(proto::TableStats* out) const;

 private:
  explicit TableShard(std::unique_ptr<const TableLayout> layout);
  // Apply the held step `clock` of a range part (dense) or of a range's key
  // batches (sparse), which is complete: the mean of its pushes, summed in
  // rank order, then StepApplied.
  SyncOutcome ApplyRangeStep(Range& range, StepAggregator& steps, Key begin,
                             Key end, Clock clock, uint64_t completing,
                             std::vector<uint64_t>* released,
                             SparseRows::Room* room);
  SyncOutcome ApplyKeyStep(Range& range, StepAggregator& steps, Clock clock,
                           uint64_t completing, std::vector<uint64_t>* released,
                           std::vector<Key>* applied_keys,
                           SparseRows::Room* room);
  // Bookkeeping of a step that the handler has just applied.
  void StepApplied(StepAggregator& steps, Clock clock, uint64_t completing,
                   std::vector<uint64_t>* released);

  const std::unique_ptr<const TableLayout> layout_;
  const int tracked_ranks_;
  // Data thread only (and PrepareMap's thread, never at the same time).
  std::vector<bool> retired_;
  StepCounts needed_;  // NeededCounts(), kept for the ranges made later
  // ClusterMap.job_workers (0: every tracked rank) and .seat_clocks.
  int joined_ = 0;
  std::vector<Clock> seat_starts_;
  // Changed only by the data thread, which holds stats_mu_ while it adds or
  // removes a range; the data thread reads it without the lock, the stats
  // (any thread) with it.
  mutable absl::Mutex stats_mu_;
  std::map<Key, std::unique_ptr<Range>> ranges_;
  StalenessTracker staleness_;
  std::vector<float> sum_;       // the mean of a step, reused across steps
  std::vector<Key> range_keys_;  // PrepareWriteRange's keys, reused
  absl::flat_hash_set<Key> held_keys_;  // PrepareWrite's pinned rows

  std::atomic<Clock> max_staleness_{0};
  std::atomic<uint64_t> tracked_pulls_{0};
  std::atomic<uint64_t> discarded_{0};
  std::atomic<uint64_t> aggregated_{0};
  std::atomic<uint64_t> dropped_task_adds_{0};
};

}  // namespace server_internal
}  // namespace downpour

#endif  // DOWNPOUR_SERVER_INTERNAL_TABLE_SHARD_H_
