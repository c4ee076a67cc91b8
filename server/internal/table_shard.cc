#include "server/internal/table_shard.h"

#include <algorithm>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "common/status_macros.h"

namespace downpour {
namespace server_internal {

absl::StatusOr<std::unique_ptr<TableShard>> TableShard::Create(
    const proto::TableSpec& spec, const std::vector<KeyRange>& ranges,
    const PluginRegistry* plugins, const PinOptions& pin_options,
    storage::ColdStore* cold_store) {
  DP_ASSIGN_OR_RETURN(
      std::unique_ptr<const TableLayout> layout,
      TableLayout::Create(spec, plugins, pin_options, cold_store));
  std::unique_ptr<TableShard> shard(new TableShard(std::move(layout)));
  for (const KeyRange& r : ranges) shard->AddRange(r);
  return shard;
}

TableShard::TableShard(std::unique_ptr<const TableLayout> layout)
    : layout_(std::move(layout)),
      tracked_ranks_(static_cast<int>(
          std::max(layout_->spec.num_workers(), layout_->spec.sync_workers()))),
      retired_(tracked_ranks_, false),
      needed_{std::max(1, static_cast<int>(layout_->spec.sync_workers())), {}},
      staleness_(tracked_ranks_,
                 static_cast<int>(layout_->spec.sync_workers())) {}

Key TableShard::Range::MedianKey() const {
  const size_t n = std::min<uint64_t>(served_requests, kKeySample);
  if (n == 0) return 0;
  std::array<Key, kKeySample> keys = key_sample;
  std::nth_element(keys.begin(), keys.begin() + n / 2, keys.begin() + n);
  return keys[n / 2];
}

TableShard::Range* TableShard::Find(Key key) {
  auto it = ranges_.upper_bound(key);
  if (it == ranges_.begin()) return nullptr;
  --it;
  return it->second->range().Contains(key) ? it->second.get() : nullptr;
}

std::vector<KeyRange> TableShard::held() const {
  absl::MutexLock lock(&stats_mu_);
  std::vector<KeyRange> out;
  for (const auto& [begin, r] : ranges_) out.push_back(r->range());
  return out;
}

TableShard::Range* TableShard::FindExact(KeyRange range) {
  auto it = ranges_.find(range.begin);
  return it != ranges_.end() && it->second->range() == range ? it->second.get()
                                                             : nullptr;
}

std::unique_ptr<TableShard::Range> TableShard::NewRange(KeyRange range) const {
  auto r =
      std::make_unique<Range>(layout_.get(), range, tracked_ranks_, needed_);
  r->shard = this;
  return r;
}

TableShard::Range* TableShard::AddRange(KeyRange range) {
  return AddRange(NewRange(range));
}

TableShard::Range* TableShard::AddRange(std::unique_ptr<Range> r) {
  Range* raw = r.get();
  absl::MutexLock lock(&stats_mu_);
  ranges_[raw->range().begin] = std::move(r);
  return raw;
}

void TableShard::RemoveRange(Key begin) {
  std::unique_ptr<Range> gone;
  {
    absl::MutexLock lock(&stats_mu_);
    auto it = ranges_.find(begin);
    if (it == ranges_.end()) return;
    gone = std::move(it->second);
    ranges_.erase(it);
  }
  // Freed outside the lock: a large range takes a while to unmap.
}

void TableShard::StepApplied(StepAggregator& steps, Clock clock,
                             uint64_t completing,
                             std::vector<uint64_t>* released) {
  StepAggregator::Finished f = steps.Finish(clock, completing);
  for (int r : f.ranks) staleness_.Applied(r, clock);
  released->insert(released->end(), f.waiters.begin(), f.waiters.end());
  aggregated_.fetch_add(1, std::memory_order_relaxed);
}

TableShard::SyncOutcome TableShard::PushSynced(
    Range& range, Key begin, Key end, int rank, Clock clock, const float* grads,
    uint64_t waiter, std::vector<uint64_t>* released, SparseRows::Room* room) {
  const size_t n = (end - begin) * width();
  StepAggregator& steps = range.StepsFor({begin, end});
  if (steps.needed(clock) == 1) {
    // One gradient is the whole step: apply it from the request's buffer.
    // The aggregated path would apply (0.0f + g) / 1, which equals g except
    // that a -0.0 gradient becomes +0.0; an update rule can tell the two
    // apart only on a parameter that is exactly -0.0, and subtracting from
    // +0.0 or a non-zero value never produces one.
    if (steps.AddDirect(clock) == StepAggregator::kLate) {
      discarded_.fetch_add(1, std::memory_order_relaxed);
      staleness_.Applied(rank, clock);
      return {SyncResult::kDiscarded};
    }
    absl::Status room_made = PrepareWriteRange(
        range, begin, end, SparseRows::Write::kPush, clock, room);
    if (room_made.ok()) range.store->PushRange(begin, end, grads);
    staleness_.Applied(rank, clock);
    StepApplied(steps, clock, 0, released);
    return {SyncResult::kApplied, grads, room_made};
  }
  switch (steps.Add(rank, clock, {}, absl::MakeConstSpan(grads, n), waiter)) {
    case StepAggregator::kLate:
      // A backup worker's late push: the step was taken without it.
      discarded_.fetch_add(1, std::memory_order_relaxed);
      staleness_.Applied(rank, clock);
      return {SyncResult::kDiscarded};
    case StepAggregator::kHeld:
      return {SyncResult::kHeld};
    case StepAggregator::kComplete:
      break;
  }
  return ApplyRangeStep(range, steps, begin, end, clock, waiter, released,
                        room);
}

TableShard::SyncOutcome TableShard::ApplyRangeStep(
    Range& range, StepAggregator& steps, Key begin, Key end, Clock clock,
    uint64_t completing, std::vector<uint64_t>* released,
    SparseRows::Room* room) {
  const size_t n = (end - begin) * width();
  // In rank order, so the result does not depend on arrival order.
  steps.Mean(clock, n, &sum_);
  absl::Status room_made = PrepareWriteRange(
      range, begin, end, SparseRows::Write::kPush, clock, room);
  if (room_made.ok()) range.store->PushRange(begin, end, sum_.data());
  StepApplied(steps, clock, completing, released);
  return {SyncResult::kApplied, sum_.data(), room_made};
}

TableShard::SyncOutcome TableShard::PushSyncedKeys(
    Range& range, KeyRange stretch, absl::Span<const Key> keys, int rank,
    Clock clock, const float* grads, uint64_t waiter,
    std::vector<uint64_t>* released, std::vector<Key>* applied_keys,
    SparseRows::Room* room) {
  // No shortcut for one rank: even one rank's batch is summed per key
  // (repeats included) and applied in ascending key order.
  StepAggregator& steps = range.StepsFor(stretch);
  switch (steps.Add(rank, clock, keys,
                    absl::MakeConstSpan(grads, keys.size() * width()),
                    waiter)) {
    case StepAggregator::kLate:
      discarded_.fetch_add(1, std::memory_order_relaxed);
      staleness_.Applied(rank, clock);
      return {SyncResult::kDiscarded};
    case StepAggregator::kHeld:
      return {SyncResult::kHeld};
    case StepAggregator::kComplete:
      break;
  }
  return ApplyKeyStep(range, steps, clock, waiter, released, applied_keys,
                      room);
}

TableShard::SyncOutcome TableShard::ApplyKeyStep(
    Range& range, StepAggregator& steps, Clock clock, uint64_t completing,
    std::vector<uint64_t>* released, std::vector<Key>* applied_keys,
    SparseRows::Room* room) {
  const size_t w = width();
  const std::vector<StepAggregator::Push>& pushes = steps.Pushes(clock);
  // The union of the ranks' keys, ascending: rows are then created in the
  // same order on every run, not only given the same values.
  std::vector<Key>& all = *applied_keys;
  all.clear();
  for (const StepAggregator::Push& p : pushes) {
    const absl::Span<const uint64_t> keys = p.Keys();
    all.insert(all.end(), keys.begin(), keys.end());
  }
  std::sort(all.begin(), all.end());
  all.erase(std::unique(all.begin(), all.end()), all.end());
  absl::flat_hash_map<Key, size_t> slot;
  slot.reserve(all.size());
  for (size_t i = 0; i < all.size(); ++i) slot[all[i]] = i;
  // Each key's sum starts at 0 and adds the ranks' gradients in rank order,
  // as the range form does; a rank that did not push a key adds nothing (a
  // zero gradient), so the mean is over every rank.
  sum_.assign(all.size() * w, 0.0f);
  for (const StepAggregator::Push& p : pushes) {
    const absl::Span<const uint64_t> keys = p.Keys();
    for (size_t i = 0; i < keys.size(); ++i) {
      float* dst = sum_.data() + slot[keys[i]] * w;
      const float* g = p.Grads().data() + i * w;
      for (size_t j = 0; j < w; ++j) dst[j] += g[j];
    }
  }
  const float count = static_cast<float>(steps.PushedCount(clock));
  for (float& v : sum_) v /= count;
  // A step that does not fit changes nothing, and every push of it hears
  // why; the step is closed either way (held, it would hold the job).
  absl::Status room_made =
      PrepareWrite(range, all, SparseRows::Write::kPush, clock, room);
  if (room_made.ok()) {
    range.store->Push(all, sum_.data());
  } else {
    all.clear();  // the backups close the step with nothing applied too
  }
  StepApplied(steps, clock, completing, released);
  return {SyncResult::kApplied, sum_.data(), room_made};
}

absl::Status TableShard::PrepareWrite(Range& range, absl::Span<const Key> keys,
                                      SparseRows::Write write, Clock except,
                                      SparseRows::Room* room) {
  SparseRows* rows = range.store->sparse();
  if (rows == nullptr || !rows->bounded() || room == nullptr) {
    return absl::OkStatus();
  }
  // The rows of held steps stay: their gradients are applied later.
  held_keys_.clear();
  for (const auto& [part, steps] : range.steps) {
    steps.ForEachHeldKey(except, [this](Key k) { held_keys_.insert(k); });
  }
  absl::Status s = rows->Prepare(
      keys, write, held_keys_.empty() ? nullptr : &held_keys_, room);
  if (s.ok()) return s;
  return absl::Status(
      s.code(), absl::StrCat("table '", spec().name(), "': ", s.message()));
}

absl::Status TableShard::PrepareWriteRange(Range& range, Key begin, Key end,
                                           SparseRows::Write write,
                                           Clock except,
                                           SparseRows::Room* room) {
  SparseRows* rows = range.store->sparse();
  if (rows == nullptr || !rows->bounded() || room == nullptr) {
    return absl::OkStatus();
  }
  range_keys_.clear();
  for (Key k = begin; k < end; ++k) range_keys_.push_back(k);
  return PrepareWrite(range, range_keys_, write, except, room);
}

void TableShard::ExpireIdle(
    size_t max_rows, std::vector<std::pair<Range*, std::vector<Key>>>* gone) {
  for (const auto& [begin, range] : ranges_) {
    SparseRows* rows = range->store->sparse();
    if (rows == nullptr || !rows->bounded() ||
        range->role != Range::Role::kPrimary || range->lost ||
        range->handing_to != kNoNode) {
      continue;
    }
    held_keys_.clear();
    for (const auto& [part, steps] : range->steps) {
      steps.ForEachHeldKey(-1, [this](Key k) { held_keys_.insert(k); });
    }
    SparseRows::Room room;
    absl::Status s = rows->Expire(
        max_rows, held_keys_.empty() ? nullptr : &held_keys_, &room);
    if (!s.ok()) {
      DP_LOG(WARNING) << "table '" << spec().name() << "' keys ["
                      << range->range().begin << ", " << range->range().end
                      << "): expiry stopped: " << s;
    }
    if (!room.gone.empty())
      gone->push_back({range.get(), std::move(room.gone)});
  }
}

void TableShard::Retire(absl::Span<const int> ranks,
                        std::vector<uint64_t>* orphans,
                        std::vector<HeldStep>* complete) {
  std::vector<int> fresh;
  for (int r : ranks) {
    if (r < 0 || r >= tracked_ranks_ || retired_[r]) continue;
    retired_[r] = true;
    staleness_.Retire(r);
    fresh.push_back(r);
  }
  if (fresh.empty() || spec().sync_workers() == 0) return;
  needed_ = NeededCounts();
  for (const auto& [begin, range] : ranges_) {
    range->SetNeeded(needed_);
    for (auto& [part, steps] : range->steps) {
      std::vector<Clock> done;
      for (int r : fresh) done = steps.Retire(r, needed_, orphans);
      for (Clock c : done) {
        complete->push_back({range.get(), {part.first, part.second}, c});
      }
    }
  }
}

StepCounts TableShard::NeededCounts() const {
  const int sync = static_cast<int>(spec().sync_workers());
  const int seats = static_cast<int>(seat_starts_.size());
  const int first_seat = seats == 0 || joined_ <= 0
                             ? tracked_ranks_
                             : std::clamp(joined_ - seats, 0, tracked_ranks_);
  int live = 0;
  for (int r = 0; r < first_seat; ++r) live += retired_[r] ? 0 : 1;
  StepCounts counts;
  int n = std::min(sync, live);
  counts.base = std::max(1, n);
  std::vector<Clock> starts;
  for (int i = 0; i < seats && first_seat + i < tracked_ranks_; ++i) {
    if (!retired_[first_seat + i]) starts.push_back(seat_starts_[i]);
  }
  std::sort(starts.begin(), starts.end());
  for (size_t i = 0; i < starts.size(); ++i) {
    ++n;
    if (i + 1 < starts.size() && starts[i + 1] == starts[i]) continue;
    counts.changes.push_back({starts[i], std::max(1, n)});
  }
  return counts;
}

void TableShard::SetJoinedWorkers(int joined,
                                  const std::vector<Clock>& seat_starts) {
  staleness_.SetJoined(joined, seat_starts);
  joined_ = joined;
  seat_starts_ = seat_starts;
  if (spec().sync_workers() == 0) return;
  needed_ = NeededCounts();
  // Every range, those this map brought too (made before it was applied).
  for (const auto& [begin, range] : ranges_) {
    range->SetNeeded(needed_);
    for (auto& [part, steps] : range->steps) {
      // A seat only raises the count, from a step no worker has started
      // (the scheduler holds the gate below it until every server has
      // applied this map): no held step can become complete here.
      if (!steps.SetNeeded(needed_).empty()) {
        DP_LOG(ERROR) << "table '" << spec().name() << "': a seat made a "
                      << "held step complete; it stays held";
      }
    }
  }
}

TableShard::SyncOutcome TableShard::CompleteStep(
    const HeldStep& step, std::vector<uint64_t>* released,
    std::vector<Key>* applied_keys, SparseRows::Room* room) {
  StepAggregator& steps = step.range->StepsFor(step.part);
  return layout_->dense
             ? ApplyRangeStep(*step.range, steps, step.part.begin,
                              step.part.end, step.clock, 0, released, room)
             : ApplyKeyStep(*step.range, steps, step.clock, 0, released,
                            applied_keys, room);
}

void TableShard::RecordApplied(int rank, Clock clock) {
  if (tracked_ranks_ > 0) staleness_.Applied(rank, clock);
}

void TableShard::MergeApplied(absl::Span<const Clock> counts) {
  const size_t n = std::min(counts.size(), static_cast<size_t>(tracked_ranks_));
  for (size_t r = 0; r < n; ++r) {
    if (counts[r] > 0) staleness_.Applied(static_cast<int>(r), counts[r] - 1);
  }
}

Clock TableShard::ObservePull(Clock clock) {
  if (tracked_ranks_ == 0) return 0;
  const Clock s = staleness_.Observe(clock);
  tracked_pulls_.fetch_add(1, std::memory_order_relaxed);
  max_staleness_.store(staleness_.max_observed(), std::memory_order_relaxed);
  return s;
}

void TableShard::FillStats(proto::TableStats* out) const {
  out->set_name(layout_->spec.name());
  {
    absl::MutexLock lock(&stats_mu_);
    for (const auto& [begin, r] : ranges_) r->store->AddStats(out);
  }
  out->set_max_staleness(max_staleness_.load(std::memory_order_relaxed));
  out->set_tracked_pulls(tracked_pulls_.load(std::memory_order_relaxed));
  out->set_discarded_pushes(discarded_.load(std::memory_order_relaxed));
  out->set_aggregated_steps(aggregated_.load(std::memory_order_relaxed));
  out->set_dropped_task_adds(
      dropped_task_adds_.load(std::memory_order_relaxed));
}

}  // namespace server_internal
}  // namespace downpour
