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
  // Blocks of 256: keys that are not consecutive are told from the first.
  for (size_t i = 1; i < n; i += 256) {
    const size_t m = std::min<size_t>(256, n - i);
    if (!CheckBlock(keys + i, m, 0, ~Key{0}, keys[i - 1]).consecutive) {
      return false;
    }
  }
  return true;
}

absl::StatusOr<BatchSplit> PlanSplit(const RangeLocator& ranges,
                                     absl::Span<const Key> keys,
                                     const Selection& selection) {
  BatchSplit out;
  const size_t n = selection.size();
  if (n == 0) return out;
  absl::InlinedVector<size_t, 4> counts(ranges.size(), 0),
      starts(ranges.size(), 0);
  int last_range = -1;
  Key prev = keys[selection.at(0)] - 1;
  size_t i = 0;
  // Adds the selection's [from, to), all in range r, to the plan.
  auto add_run = [&](int r, size_t from, size_t to) {
    if (r < last_range) out.runs = false;
    if (counts[r] == 0) starts[r] = from;
    counts[r] += to - from;
    last_range = r;
  };
  if (selection.list == nullptr) {
    // Run by run, each checked in blocks of keys without a branch per key:
    // one range's keys (one server, or sorted keys), or each range's in a
    // run (sorted keys over several), cost a read of the keys. Runs that
    // turn out short (scattered keys) go key by key below.
    const Key* k = keys.data() + selection.first;
    size_t runs = 0;
    while (i < n && (runs < 16 || runs * 256 < i)) {
      const int r = ranges.Find(k[i]);
      if (r < 0) return Outside(k[i]);
      const Key lo = ranges.begin(r), span = ranges.end(r) - lo;
      size_t j = i;
      for (size_t m = 256; j < n; j += m) {
        m = std::min<size_t>(256, n - j);
        const BlockCheck b = CheckBlock(k + j, m, lo, span, prev);
        if (!b.inside) break;
        out.consecutive = out.consecutive && b.consecutive;
        prev = k[j + m - 1];
      }
      for (; j < n && k[j] - lo < span; ++j) {
        out.consecutive = out.consecutive && k[j] == prev + 1;
        prev = k[j];
      }
      add_run(r, i, j);
      i = j;
      ++runs;
    }
  }
  // Key by key: a list of positions (a retried part), or scattered keys.
  // No branch on the key's range: scattered keys change range at random,
  // and a mispredicted branch a key cost as much as the rest of the loop.
  bool backwards = false;
  uint64_t gaps = 0;
  for (; i < n; ++i) {
    const Key k = keys[selection.at(i)];
    const int r = ranges.Find(k);
    if (r < 0) return Outside(k);
    backwards |= r < last_range;
    starts[r] = counts[r] == 0 ? i : starts[r];
    ++counts[r];
    last_range = r;
    gaps |= (k - prev) ^ 1;
    prev = k;
  }
  if (backwards) out.runs = false;
  if (gaps != 0) out.consecutive = false;
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

const proto::TableMap& StepStretches(const proto::TableMap& table,
                                     proto::TableMap* storage) {
  const bool any = std::any_of(
      table.ranges().begin(), table.ranges().end(),
      [](const proto::RangeAssignment& r) { return r.step_cuts_size() > 0; });
  if (!any) return table;
  storage->Clear();
  *storage->mutable_spec() = table.spec();
  for (const proto::RangeAssignment& r : table.ranges()) {
    Key begin = r.begin();
    for (int i = 0; i <= r.step_cuts_size(); ++i) {
      const Key end = i < r.step_cuts_size() ? r.step_cuts(i) : r.end();
      proto::RangeAssignment* s = storage->add_ranges();
      *s = r;
      s->clear_step_cuts();
      s->set_begin(begin);
      s->set_end(end);
      begin = end;
    }
  }
  return *storage;
}

}  // namespace downpour
