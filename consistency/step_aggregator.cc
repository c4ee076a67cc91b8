#include "consistency/step_aggregator.h"

#include <algorithm>
#include <utility>

namespace downpour {

void StepAggregator::set_next_clock(Clock clock) {
  if (clock <= next_clock_) return;
  next_clock_ = clock;
  while (!pending_.empty() && pending_.begin()->first < clock) {
    for (Push& p : pending_.begin()->second.by_rank) Recycle(p);
    pending_.erase(pending_.begin());
  }
}

std::vector<uint64_t> StepAggregator::Abandon() {
  std::vector<uint64_t> waiters;
  for (auto& [clock, step] : pending_) {
    for (Push& p : step.by_rank) {
      waiters.insert(waiters.end(), p.waiters.begin(), p.waiters.end());
      Recycle(p);
    }
  }
  pending_.clear();
  return waiters;
}

void StepAggregator::Reset(Clock next_clock) {
  Abandon();
  next_clock_ = next_clock;
}

void StepAggregator::Recycle(Push& p) {
  if (p.pushed && p.grads.capacity() > 0) spare_.push_back(std::move(p.grads));
}

std::vector<float> StepAggregator::TakeSpare() {
  if (spare_.empty()) return {};
  std::vector<float> v = std::move(spare_.back());
  spare_.pop_back();
  return v;
}

StepAggregator::Result StepAggregator::Add(int rank, Clock clock,
                                           absl::Span<const uint64_t> keys,
                                           absl::Span<const float> grads,
                                           uint64_t waiter) {
  // A backup worker's late push: the step was taken without it.
  if (clock < next_clock_) return kLate;
  Step& step = pending_[clock];
  if (step.by_rank.empty()) step.by_rank.resize(ranks_);
  Push& held = step.by_rank[rank];
  if (waiter != 0) held.waiters.push_back(waiter);
  if (held.pushed) return kHeld;  // a resend
  held.pushed = true;
  if (++step.count >= needed_.At(clock)) {
    // The caller applies the step now, from its buffers (see Add).
    held.borrowed = true;
    held.borrowed_keys = keys;
    held.borrowed_grads = grads;
    return kComplete;
  }
  held.keys.assign(keys.begin(), keys.end());
  held.grads = TakeSpare();
  held.grads.assign(grads.begin(), grads.end());
  return kHeld;
}

StepAggregator::Result StepAggregator::AddDirect(Clock clock) {
  return clock < next_clock_ ? kLate : kComplete;
}

const std::vector<StepAggregator::Push>& StepAggregator::Pushes(
    Clock clock) const {
  return pending_.at(clock).by_rank;
}

int StepAggregator::PushedCount(Clock clock) const {
  auto it = pending_.find(clock);
  return it == pending_.end() ? 0 : it->second.count;
}

void StepAggregator::Mean(Clock clock, size_t n,
                          std::vector<float>* out) const {
  const Step& step = pending_.at(clock);
  const float count = static_cast<float>(step.count);
  // A block at a time, so that the sum stays in the cache while every
  // rank's gradient is added to it (one pass over memory, not one a rank).
  // The loops are written to be vectorized (BUILD: -ftree-vectorize), which
  // keeps every float's operations and their order.
  constexpr size_t kBlock = 2048;
  out->resize(n);
  for (size_t b = 0; b < n; b += kBlock) {
    const size_t m = std::min(n - b, kBlock);
    float* __restrict dst = out->data() + b;
    std::fill(dst, dst + m, 0.0f);
    for (const Push& p : step.by_rank) {
      if (!p.pushed) continue;
      const float* __restrict src = p.Grads().data() + b;
      for (size_t j = 0; j < m; ++j) dst[j] += src[j];
    }
    for (size_t j = 0; j < m; ++j) dst[j] /= count;
  }
}

StepAggregator::Finished StepAggregator::Finish(Clock clock,
                                                uint64_t completing) {
  Finished f;
  auto it = pending_.find(clock);
  if (it != pending_.end()) {
    Step& step = it->second;
    for (int r = 0; r < static_cast<int>(step.by_rank.size()); ++r) {
      Push& p = step.by_rank[r];
      // The completing request is answered by its caller; a resend of it
      // may have left its token among the waiters too, which is harmless
      // (a token answered once is forgotten).
      if (completing != 0 && !p.waiters.empty() &&
          p.waiters.back() == completing) {
        p.waiters.pop_back();
        completing = 0;
      }
      f.waiters.insert(f.waiters.end(), p.waiters.begin(), p.waiters.end());
      if (!p.pushed) continue;
      f.ranks.push_back(r);
      Recycle(p);
    }
    pending_.erase(it);
  }
  if (clock + 1 > next_clock_) next_clock_ = clock + 1;
  return f;
}

std::vector<Clock> StepAggregator::SetNeeded(StepCounts needed) {
  needed_ = std::move(needed);
  std::vector<Clock> complete;
  for (const auto& [clock, step] : pending_) {
    if (step.count >= needed_.At(clock)) complete.push_back(clock);
  }
  return complete;
}

std::vector<Clock> StepAggregator::Retire(int rank, StepCounts needed,
                                          std::vector<uint64_t>* orphans) {
  needed_ = std::move(needed);
  std::vector<Clock> complete;
  for (auto it = pending_.begin(); it != pending_.end();) {
    Step& step = it->second;
    Push& p = step.by_rank[rank];
    orphans->insert(orphans->end(), p.waiters.begin(), p.waiters.end());
    p.waiters.clear();
    if (p.pushed) {
      Recycle(p);
      p = Push();
      --step.count;
    }
    if (step.count == 0) {
      // Only the retired rank had pushed (waiters come with pushes).
      it = pending_.erase(it);
      continue;
    }
    if (step.count >= needed_.At(it->first)) complete.push_back(it->first);
    ++it;
  }
  return complete;
}

}  // namespace downpour
