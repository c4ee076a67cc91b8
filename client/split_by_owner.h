// Routing a key batch: which range (and so which server) each key goes to.
// Pure functions over a table's range assignment (proto::TableMap), shared
// by the client's batch operations and its synced sparse pushes, and tested
// on their own.
//
//   RangeLocator ranges(table);
//   DP_ASSIGN_OR_RETURN(BatchSplit split,
//                       PlanSplit(ranges, keys, Selection::Slice(0, n)));
//   if (split.runs) ... each group is a run of the selection: send slices
//   else ... gather each range's keys (GroupPositions, or in one pass)
//
// PlanSplit reads each key once and allocates nothing per key: a batch of
// millions of keys costs a pass over its keys, not a vector of positions
// per range (those pages are fresh, and writing fresh pages is slow).
//
// Thread-safe: no state (a RangeLocator is immutable once built).
#ifndef DOWNPOUR_CLIENT_SPLIT_BY_OWNER_H_
#define DOWNPOUR_CLIENT_SPLIT_BY_OWNER_H_

#include <cstddef>
#include <vector>

#include "absl/container/inlined_vector.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "common/types.h"
#include "proto/downpour.pb.h"

namespace downpour {

// A table's ranges as flat arrays, to find the range of many keys fast.
class RangeLocator {
 public:
  // table.ranges() sorted by begin, as the scheduler makes them.
  explicit RangeLocator(const proto::TableMap& table);

  int size() const { return static_cast<int>(begins_.size()); }
  Key begin(int r) const { return begins_[r]; }
  Key end(int r) const { return ends_[r]; }
  NodeId server(int r) const { return servers_[r]; }

  // Index into table.ranges() of the range holding `key`; -1 outside the
  // table's key space (past the last range, or in a gap between two).
  int Find(Key key) const {
    const int n = size();
    int r = -1;
    if (n <= 8) {
      // Branch-free over a few ranges: the number of ranges starting at or
      // before the key, minus one.
      for (int i = 0; i < n; ++i) r += begins_[i] <= key;
    } else {
      int lo = 0, hi = n;  // the first range starting after the key
      while (lo < hi) {
        const int mid = (lo + hi) / 2;
        if (begins_[mid] <= key) {
          lo = mid + 1;
        } else {
          hi = mid;
        }
      }
      r = lo - 1;
    }
    return r >= 0 && key < ends_[r] ? r : -1;
  }

 private:
  absl::InlinedVector<Key, 4> begins_, ends_;
  absl::InlinedVector<NodeId, 4> servers_;
};

// Positions of some keys of a batch: the run [first, first + count), or an
// explicit list (a retried part whose keys were scattered).
struct Selection {
  static Selection Slice(size_t first, size_t count) {
    Selection s;
    s.first = first;
    s.count = count;
    return s;
  }
  static Selection List(absl::Span<const size_t> positions) {
    Selection s;
    s.list = positions.data();
    s.count = positions.size();
    return s;
  }
  size_t size() const { return count; }
  // Position in the batch of the i-th selected key.
  size_t at(size_t i) const { return list != nullptr ? list[i] : first + i; }

  size_t first = 0;
  size_t count = 0;
  const size_t* list = nullptr;
};

// How a selection of a batch falls on the ranges of a table.
struct BatchSplit {
  struct Group {
    int range = -1;  // index into the table's ranges
    size_t count = 0;
    // With `runs`: the group is the selection's [start, start + count).
    size_t start = 0;
  };
  // Ranges holding at least one of the keys, in key-space order.
  absl::InlinedVector<Group, 4> groups;
  // Each range's keys are one run of the selection, and the runs come in
  // key-space order (true whenever the keys are sorted, or one range holds
  // them all): such groups need no gathering when the selection is a slice.
  bool runs = true;
  // The selection's keys are k, k + 1, k + 2, ... in that order.
  bool consecutive = true;
};

// Plans the split of `selection` (positions into `keys`) by range, in one
// pass over the keys. kOutOfRange, naming the key, for the first key
// (in selection order) outside the table's key space. REQUIRES: every
// selected position < keys.size().
absl::StatusOr<BatchSplit> PlanSplit(const RangeLocator& ranges,
                                     absl::Span<const Key> keys,
                                     const Selection& selection);

// Whether keys[0, n) are k, k + 1, ..., k + n - 1.
bool Consecutive(const Key* keys, size_t n);

// The keys of a batch that one range of the table holds.
struct OwnerGroup {
  int range = -1;                 // index into table.ranges()
  NodeId server = kNoNode;        // that range's primary
  std::vector<size_t> positions;  // into the batch, in the order given
};

struct SplitOptions {
  // Also an empty group for every range that holds none of the keys (a
  // synced push must reach every range, see client.h's
  // TableOptions::sync_workers).
  bool every_range = false;
};

// Groups `positions` (indices into `keys`) by the range of `table` that
// holds each key (table.ranges() sorted by begin, as the scheduler makes
// them): one group per range holding one of them (per range with
// every_range), in key-space order. kOutOfRange, naming the key, for the
// first key outside the table's key space. REQUIRES: every position <
// keys.size().
absl::StatusOr<std::vector<OwnerGroup>> SplitByOwner(
    const proto::TableMap& table, absl::Span<const Key> keys,
    absl::Span<const size_t> positions, const SplitOptions& options = {});

// `table` with its ranges cut at their step cuts (RangeAssignment
// .step_cuts): each stretch a range of its own, with its range's holders.
// Synced pushes are routed over these, since their ranges aggregate each
// stretch apart. Returns `table` itself when no range has cuts (nothing
// copied), else `*storage`, filled.
const proto::TableMap& StepStretches(const proto::TableMap& table,
                                     proto::TableMap* storage);

}  // namespace downpour

#endif  // DOWNPOUR_CLIENT_SPLIT_BY_OWNER_H_
