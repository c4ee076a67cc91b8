#include "client/split_by_owner.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"

namespace downpour {
namespace {

absl::Status Outside(Key key) {
  return absl::OutOfRangeError(
      absl::StrCat("key ", key, " is outside the table's key space"));
}

// Whether keys[0, n) all lie in [lo, lo + span) and run k, k + 1, ...
// (`prev` is the key before keys[0]). Four at a time and without branches
// per key: a batch of millions of keys to one range is checked at memory
// speed.
struct BlockCheck {
  bool inside;
  bool consecutive;
};
BlockCheck CheckBlock(const Key* keys, size_t n, Key lo, Key span, Key prev) {
  uint64_t outside = 0, gaps = 0;
  size_t i = 0;
  for (; i + 4 <= n; i += 4) {
    const Key a = keys[i], b = keys[i + 1], c = keys[i + 2], d = keys[i + 3];
    outside |= static_cast<uint64_t>(a - lo >= span) |
               static_cast<uint64_t>(b - lo >= span) |
               static_cast<uint64_t>(c - lo >= span) |
               static_cast<uint64_t>(d - lo >= span);
    gaps |= ((a - prev) ^ 1) | ((b - a) ^ 1) | ((c - b) ^ 1) | ((d - c) ^ 1);
    prev = d;
  }
  for (; i < n; ++i) {
    outside |= static_cast<uint64_t>(keys[i] - lo >= span);
    gaps |= (keys[i] - prev) ^ 1;
    prev = keys[i];
  }
  return {outside == 0, gaps == 0};
}

}  // namespace

RangeLocator::RangeLocator(const proto::TableMap& table) {
  begins_.reserve(table.ranges_size());
  ends_.reserve(table.ranges_size());
  servers_.reserve(table.ranges_size());
  for (const proto::RangeAssignment& r : table.ranges()) {
    begins_.push_back(r.begin());
    ends_.push_back(r.end());
    servers_.push_back(r.primary());
  }
}

bool Consecutive(const Key* keys, size_t n) {
  if (n == 0) return true;
  return CheckBlock(keys + 1, n - 1, 0, ~Key{0}, keys[0]).consecutive;
}

absl::StatusOr<BatchSplit> PlanSplit(const RangeLocator& ranges,
                                     absl::Span<const Key> keys,
                                     const Selection& selection) {
  BatchSplit out;
  const size_t n = selection.size();
  if (n == 0) return out;
  const Key k0 = keys[selection.at(0)];
  const int r0 = ranges.Find(k0);
  if (r0 < 0) return Outside(k0);
  if (selection.list == nullptr) {
    // The common case first: the first key's range holds them all (one
    // server, or sorted keys within one range). Blocks of 256 keys, so that
    // a batch spread over several ranges leaves this path early.
    const Key* k = keys.data() + selection.first;
    const Key lo = ranges.begin(r0), span = ranges.end(r0) - lo;
    bool inside = true, consecutive = true;
    Key prev = k0 - 1;
    for (size_t i = 0; i < n && inside; i += 256) {
      const size_t m = std::min<size_t>(256, n - i);
      const BlockCheck b = CheckBlock(k + i, m, lo, span, prev);
      inside = b.inside;
      consecutive = consecutive && b.consecutive;
      prev = k[i + m - 1];
    }
    if (inside) {
      out.groups.push_back({r0, n, 0});
      out.consecutive = consecutive;
      return out;
    }
  }
  // Key by key: counts per range, where each range's keys start, and
  // whether the ranges come in runs.
  absl::InlinedVector<size_t, 4> counts(ranges.size(), 0),
      starts(ranges.size(), 0);
  int prev_range = -1;
  Key prev_key = k0 - 1;
  for (size_t i = 0; i < n; ++i) {
    const Key k = keys[selection.at(i)];
    const int r = ranges.Find(k);
    if (r < 0) return Outside(k);
    if (r != prev_range) {
      if (r < prev_range) out.runs = false;
      if (counts[r] == 0) starts[r] = i;
      prev_range = r;
    }
    ++counts[r];
    out.consecutive = out.consecutive && k == prev_key + 1;
    prev_key = k;
  }
  for (int r = 0; r < ranges.size(); ++r) {
    if (counts[r] > 0) out.groups.push_back({r, counts[r], starts[r]});
  }
  return out;
}

absl::StatusOr<std::vector<OwnerGroup>> SplitByOwner(
    const proto::TableMap& table, absl::Span<const Key> keys,
    absl::Span<const size_t> positions, const SplitOptions& options) {
  const RangeLocator ranges(table);
  std::vector<OwnerGroup> groups(ranges.size());
  for (int r = 0; r < ranges.size(); ++r) {
    groups[r].range = r;
    groups[r].server = ranges.server(r);
  }
  for (size_t p : positions) {
    const int r = ranges.Find(keys[p]);
    if (r < 0) return Outside(keys[p]);
    groups[r].positions.push_back(p);
  }
  if (!options.every_range) {
    std::vector<OwnerGroup> used;
    for (OwnerGroup& g : groups) {
      if (!g.positions.empty()) used.push_back(std::move(g));
    }
    groups = std::move(used);
  }
  return groups;
}

}  // namespace downpour
