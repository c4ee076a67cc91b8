// Synchronous (BSP) aggregation of one part of a table (one key range on
// one server): gradients that carry a worker clock are held per clock until
// `needed` distinct workers have pushed that clock, then handed back once,
// in rank order, for the caller to average and apply. The protocol beside
// the storage: the aggregator holds copies of gradients and the clocks
// applied; it never touches the table.
//
//   StepAggregator steps(/*ranks=*/N + b, /*needed=*/N);
//   switch (steps.Add(rank, clock, keys, grads, waiter)) {
//     case StepAggregator::kLate: ...          // dropped: already applied
//     case StepAggregator::kHeld: ...          // waiting for other ranks
//     case StepAggregator::kComplete:          // this push completed it
//       apply the mean of steps.Pushes(clock) ...
//       released = steps.Finish(clock, waiter);
//   }
//
// A rank's resend of a clock it already pushed is ignored (kHeld). The push
// that completes a step is not copied: the caller applies the step from its
// request's buffers at once. With needed == 1, AddDirect lets the caller
// apply a lone gradient straight from its request buffer as well. When the job
// goes on without a rank (Retire), its held pushes are dropped and fewer ranks
// complete a step. A BSP job that grows (a worker took an elastic seat) needs
// more ranks from the step the scheduler announced on (StepCounts): the count
// is a function of the clock, not of when the server learnt of it.
//
// Gradient buffers are recycled across steps: on these machines writing to
// fresh pages is ~40x slower than to reused ones.
//
// Thread-compatible: the server's data thread owns it.
#ifndef DOWNPOUR_CONSISTENCY_STEP_AGGREGATOR_H_
#define DOWNPOUR_CONSISTENCY_STEP_AGGREGATOR_H_

#include <cstdint>
#include <map>
#include <utility>
#include <vector>

#include "absl/types/span.h"
#include "consistency/consistency.h"

namespace downpour {

// Distinct ranks that complete each step: `base` below the first change,
// then each change's count from its clock on (changes ascending by clock).
struct StepCounts {
  int base = 1;
  std::vector<std::pair<Clock, int>> changes;
  int At(Clock clock) const {
    int n = base;
    for (const auto& [from, count] : changes) {
      if (from > clock) break;
      n = count;
    }
    return n;
  }
};

class StepAggregator {
 public:
  // One rank's held push.
  struct Push {
    bool pushed = false;
    // The push's keys (key batches only) and gradients: copies while held;
    // the caller's own buffers for the push that completed the step.
    absl::Span<const uint64_t> Keys() const {
      return borrowed ? borrowed_keys : absl::MakeConstSpan(keys);
    }
    absl::Span<const float> Grads() const {
      return borrowed ? borrowed_grads : absl::MakeConstSpan(grads);
    }
    // Its requests waiting for the step (a resend adds one).
    std::vector<uint64_t> waiters;

   private:
    friend class StepAggregator;
    std::vector<uint64_t> keys;
    std::vector<float> grads;
    bool borrowed = false;
    absl::Span<const uint64_t> borrowed_keys;
    absl::Span<const float> borrowed_grads;
  };
  enum Result { kHeld, kComplete, kLate };

  // `ranks`: ranks a push may carry (N + b + E); `needed`: distinct ranks
  // that complete each step (N). REQUIRES: 1 <= every count <= ranks.
  StepAggregator(int ranks, StepCounts needed)
      : ranks_(ranks), needed_(std::move(needed)) {}
  StepAggregator(int ranks, int needed)
      : StepAggregator(ranks, StepCounts{needed, {}}) {}

  int needed(Clock clock) const { return needed_.At(clock); }
  // The first clock not yet applied.
  Clock next_clock() const { return next_clock_; }
  // For a replica that learns the applied clock from its primary (or a
  // restored checkpoint): steps below `clock` are applied. Held steps below
  // it are dropped. Never moves back.
  void set_next_clock(Clock clock);

  // Records `rank`'s push for `clock` (keys: for key batches, else empty).
  // `waiter` != 0 names a request that wants an answer once the step is
  // applied; it is remembered with the step (kHeld) and returned by Finish.
  // kComplete: the caller applies the step (Pushes, then Finish) before
  // `keys` and `grads` go away, since this push is read from them.
  // REQUIRES: 0 <= rank < ranks.
  Result Add(int rank, Clock clock, absl::Span<const uint64_t> keys,
             absl::Span<const float> grads, uint64_t waiter);
  // needed(clock) == 1 and nothing held for `clock`: the caller may apply
  // the gradient straight from its buffer and then call Finish(clock, 0).
  // Returns kLate for an applied clock, kComplete otherwise (nothing is
  // copied). REQUIRES: needed(clock) == 1.
  Result AddDirect(Clock clock);

  // The held pushes of `clock`, by rank (only those with `pushed` count).
  // REQUIRES: Add returned kComplete for it.
  const std::vector<Push>& Pushes(Clock clock) const;
  int PushedCount(Clock clock) const;
  // The mean of `clock`'s pushes of `n` floats each (range parts), into
  // out[0, n): every float is 0 + g_0 + g_1 + ... in rank order over the
  // ranks that pushed, divided by their count, whatever order the pushes
  // came in. REQUIRES: Add returned kComplete for it; every push holds n
  // floats.
  void Mean(Clock clock, size_t n, std::vector<float>* out) const;

  // Closes `clock` after the caller applied it: returns the waiters the step
  // remembered, except `completing` (the request that completed it, which
  // its caller answers directly), and the ranks that pushed it.
  struct Finished {
    std::vector<uint64_t> waiters;
    std::vector<int> ranks;
  };
  Finished Finish(Clock clock, uint64_t completing);

  // Steps held (clocks with at least one push, not yet complete).
  size_t held_steps() const { return pending_.size(); }
  // Calls fn(key) for every key of every held push of a clock other than
  // `except` (key batches): the rows a bounded table must not evict.
  template <typename F>
  void ForEachHeldKey(Clock except, F fn) const {
    for (const auto& [clock, step] : pending_) {
      if (clock == except) continue;
      for (const Push& p : step.by_rank) {
        if (!p.pushed) continue;
        for (uint64_t k : p.Keys()) fn(k);
      }
    }
  }

  // The job went on without `rank`: its held pushes are dropped (their
  // waiters appended to `orphans`, for the caller to answer with an
  // error), and from now on `needed` counts the ranks that complete a
  // step. Returns the held clocks that are complete by that count,
  // ascending; the caller applies each as after Add's kComplete (Pushes,
  // Finish). REQUIRES: 0 <= rank < ranks; every count >= 1.
  std::vector<Clock> Retire(int rank, StepCounts needed,
                            std::vector<uint64_t>* orphans);
  // From now on `needed` counts the ranks that complete a step (a BSP job
  // grew). Returns the held clocks complete by it, as Retire does.
  std::vector<Clock> SetNeeded(StepCounts needed);

  // Drops every held step and returns the waiters they remembered (to be
  // answered with an error): the part moved to another server.
  std::vector<uint64_t> Abandon();
  // Drops every held step and sets the first clock not applied, up or down
  // (a replica taking its primary's state).
  void Reset(Clock next_clock);

 private:
  struct Step {
    std::vector<Push> by_rank;
    int count = 0;
  };
  std::vector<float> TakeSpare();
  // Keeps a held push's gradient buffer for a later push.
  void Recycle(Push& p);

  const int ranks_;
  StepCounts needed_;
  Clock next_clock_ = 0;
  std::map<Clock, Step> pending_;
  std::vector<std::vector<float>> spare_;
};

}  // namespace downpour

#endif  // DOWNPOUR_CONSISTENCY_STEP_AGGREGATOR_H_
