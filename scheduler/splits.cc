#include "scheduler/splits.h"

#include <algorithm>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace downpour {
namespace {

bool Alive(const proto::ClusterMap& map, NodeId id) {
  for (const proto::NodeInfo& n : map.nodes()) {
    if (n.id() == id) return n.state() == proto::ALIVE;
  }
  return false;
}

// Why the range cannot start a split now (empty: it can).
std::string Busy(const proto::ClusterMap& map,
                 const proto::RangeAssignment& r) {
  if (r.lost()) return "its data was lost";
  if (r.split_at() != 0) {
    return absl::StrCat("it is being split at key ", r.split_at());
  }
  if (r.merge() != proto::RangeAssignment::NO_MERGE) {
    return "it is being merged with a neighbour";
  }
  if (r.move_to() != kNoNode) {
    return absl::StrCat("it is moving to server ", r.move_to());
  }
  if (r.handing_to() != kNoNode) {
    return absl::StrCat("it is being handed to server ", r.handing_to());
  }
  if (r.catching_up_size() > 0) {
    return absl::StrCat("server ", r.catching_up(0), " is copying it");
  }
  if (!Alive(map, r.primary())) {
    return absl::StrCat("its primary, server ", r.primary(), ", is not alive");
  }
  return "";
}

bool Bounded(const proto::TableSpec& spec) {
  return spec.kind() == proto::SPARSE && spec.has_bounds();
}

proto::TableMap* FindTable(proto::ClusterMap* map, TableId id) {
  for (proto::TableMap& t : *map->mutable_tables()) {
    if (t.spec().id() == id) return &t;
  }
  return nullptr;
}

// The servers holding a range: its primary and in-sync backups, sorted.
std::vector<NodeId> Holders(const proto::RangeAssignment& r) {
  std::vector<NodeId> h(r.replicas().begin(), r.replicas().end());
  h.push_back(r.primary());
  std::sort(h.begin(), h.end());
  return h;
}

// Why cutting `r`, a range of a table with `spec`, at `key` leaves a piece
// too small (empty: it does not). A bounded sparse table's pieces keep row
// caps by their share of the key space (common/sparse_row_bytes.h), which
// fits ids spread over it (hashed); a cut far from the middle would leave a
// piece a sliver of the range's cap while, with ids that are not spread,
// it may get most of the rows.
std::string UnevenCut(const proto::TableSpec& spec,
                      const proto::RangeAssignment& r, Key key) {
  if (!Bounded(spec) || key <= r.begin() || key >= r.end()) return "";
  const uint64_t extent = r.end() - r.begin();
  const uint64_t piece = std::min(key - r.begin(), r.end() - key);
  // At least a share of 1/kMinBoundedPieceShare (rounded up), without
  // overflow at the key space's end.
  if (piece >= extent / kMinBoundedPieceShare +
                   (extent % kMinBoundedPieceShare != 0 ? 1 : 0)) {
    return "";
  }
  return absl::StrFormat(
      "the table is bounded, and a piece's row cap follows its share of the "
      "key space: a piece would keep %.2g%% of the range's cap, under 1/%d "
      "(split nearer the middle; ids are expected spread over the key "
      "space, hashed)",
      100.0 * static_cast<double>(piece) / static_cast<double>(extent),
      kMinBoundedPieceShare);
}

// Why neighbours `lo` and `hi` cannot start a merge now (empty: they can).
// `unavailable` tells a passing reason (retry later) from a lasting one.
std::string CannotMerge(const proto::ClusterMap& map,
                        const proto::RangeAssignment& lo,
                        const proto::RangeAssignment& hi, bool* unavailable) {
  *unavailable = true;
  std::string busy = Busy(map, lo);
  if (!busy.empty()) {
    return absl::StrCat("keys [", lo.begin(), ", ", lo.end(), "): ", busy);
  }
  busy = Busy(map, hi);
  if (!busy.empty()) {
    return absl::StrCat("keys [", hi.begin(), ", ", hi.end(), "): ", busy);
  }
  if (Holders(lo) != Holders(hi)) {
    *unavailable = false;
    return absl::StrCat("keys [", lo.begin(), ", ", lo.end(), ") and [",
                        hi.begin(), ", ", hi.end(),
                        ") are held by different servers; only neighbours on "
                        "the same servers are merged");
  }
  return "";
}

}  // namespace

absl::StatusOr<proto::RangeAssignment> StartSplit(proto::ClusterMap* map,
                                                  TableId table, Key key) {
  proto::TableMap* t = FindTable(map, table);
  if (t == nullptr) {
    return absl::NotFoundError(absl::StrCat("split: no table ", table));
  }
  const std::string& name = t->spec().name();
  for (proto::RangeAssignment& r : *t->mutable_ranges()) {
    if (key < r.begin() || key >= r.end()) continue;
    if (r.end() - r.begin() == 1) {
      return absl::FailedPreconditionError(
          absl::StrCat("split table '", name, "' at key ", key, ": the range [",
                       r.begin(), ", ", r.end(),
                       ") holds one key, and a range of one key is never "
                       "split"));
    }
    if (key == r.begin()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "split table '", name, "' at key ", key,
          ": the key already begins "
          "the range [",
          r.begin(), ", ", r.end(), "); name a key inside a range"));
    }
    const std::string uneven = UnevenCut(t->spec(), r, key);
    if (!uneven.empty()) {
      return absl::FailedPreconditionError(
          absl::StrCat("split table '", name, "' keys [", r.begin(), ", ",
                       r.end(), ") at key ", key, ": ", uneven));
    }
    if (t->ranges_size() >= kMaxRangesPerTable) {
      return absl::ResourceExhaustedError(
          absl::StrCat("split table '", name, "': it has ", t->ranges_size(),
                       " ranges, the most a table may have"));
    }
    const std::string busy = Busy(*map, r);
    if (!busy.empty()) {
      return absl::UnavailableError(
          absl::StrCat("split table '", name, "' keys [", r.begin(), ", ",
                       r.end(), "): ", busy, "; retry once that is done"));
    }
    r.set_split_at(key);
    return r;
  }
  return absl::OutOfRangeError(absl::StrCat("split table '", name, "': key ",
                                            key, " is outside its key space"));
}

absl::Status FinishSplit(proto::ClusterMap* map, TableId table, Key begin,
                         NodeId primary) {
  proto::TableMap* t = FindTable(map, table);
  auto* ranges = t == nullptr ? nullptr : t->mutable_ranges();
  for (int i = 0; ranges != nullptr && i < ranges->size(); ++i) {
    proto::RangeAssignment& r = *ranges->Mutable(i);
    if (r.begin() != begin) continue;
    if (r.split_at() == 0 || r.primary() != primary || r.lost() ||
        r.catching_up_size() > 0 || r.move_to() != kNoNode ||
        r.handing_to() != kNoNode) {
      return absl::FailedPreconditionError(absl::StrCat(
          "table ", table, " range from key ", begin, ": no split by primary ",
          primary, " under way (primary ", r.primary(), ", split at ",
          r.split_at(), ")"));
    }
    proto::RangeAssignment upper = r;
    const Key at = r.split_at();
    r.set_end(at);
    r.clear_split_at();
    upper.set_begin(at);
    upper.clear_split_at();
    // Step cuts go to the piece they lie inside; one at `at` is a range
    // boundary now.
    const std::vector<Key> cuts(r.step_cuts().begin(), r.step_cuts().end());
    r.clear_step_cuts();
    upper.clear_step_cuts();
    for (Key cut : cuts) {
      if (cut < at) r.add_step_cuts(cut);
      if (cut > at) upper.add_step_cuts(cut);
    }
    ranges->Add(std::move(upper));
    // Back in key order: the new range goes right after its lower half.
    for (int j = ranges->size() - 1; j > i + 1; --j)
      ranges->SwapElements(j, j - 1);
    return absl::OkStatus();
  }
  return absl::FailedPreconditionError(
      absl::StrCat("table ", table, ": no range begins at key ", begin));
}

bool CancelStaleSplits(proto::ClusterMap* map) {
  bool changed = false;
  for (proto::TableMap& t : *map->mutable_tables()) {
    auto* ranges = t.mutable_ranges();
    for (int i = 0; i < ranges->size(); ++i) {
      proto::RangeAssignment& r = *ranges->Mutable(i);
      if (r.merge() == proto::RangeAssignment::NO_MERGE) continue;
      // A merge is kept only as a pair whose neighbours could start it now.
      const bool lower = r.merge() == proto::RangeAssignment::MERGE_WITH_NEXT;
      const int j = lower ? i + 1 : i - 1;
      bool keep = j >= 0 && j < ranges->size() &&
                  ranges->Get(j).merge() ==
                      (lower ? proto::RangeAssignment::MERGE_WITH_PREVIOUS
                             : proto::RangeAssignment::MERGE_WITH_NEXT);
      if (keep) {
        proto::RangeAssignment lo = ranges->Get(lower ? i : j);
        proto::RangeAssignment hi = ranges->Get(lower ? j : i);
        lo.clear_merge();
        hi.clear_merge();
        bool unavailable = false;
        keep = CannotMerge(*map, lo, hi, &unavailable).empty();
      }
      if (keep) continue;
      r.clear_merge();
      if (j >= 0 && j < ranges->size()) ranges->Mutable(j)->clear_merge();
      changed = true;
    }
    for (proto::RangeAssignment& r : *t.mutable_ranges()) {
      if (r.split_at() == 0) continue;
      const Key at = r.split_at();
      r.clear_split_at();
      if (Busy(*map, r).empty()) {
        r.set_split_at(at);
        continue;
      }
      changed = true;
    }
  }
  return changed;
}

bool CancelSplits(proto::ClusterMap* map) {
  bool changed = false;
  for (proto::TableMap& t : *map->mutable_tables()) {
    for (proto::RangeAssignment& r : *t.mutable_ranges()) {
      if (r.split_at() == 0 && r.merge() == proto::RangeAssignment::NO_MERGE) {
        continue;
      }
      r.clear_split_at();
      r.clear_merge();
      changed = true;
    }
  }
  return changed;
}

int SplitsUnderWay(const proto::ClusterMap& map) {
  int n = 0;
  for (const proto::TableMap& t : map.tables()) {
    for (const proto::RangeAssignment& r : t.ranges()) n += r.split_at() != 0;
  }
  return n;
}

std::optional<SplitChoice> PickSplit(
    const proto::ClusterMap& map,
    const absl::flat_hash_map<std::pair<TableId, Key>, uint64_t>& load,
    const absl::flat_hash_map<std::pair<TableId, Key>, Key>& split_keys,
    double threshold) {
  absl::flat_hash_map<NodeId, uint64_t> per_server;
  for (const proto::NodeInfo& n : map.nodes()) {
    if (n.role() == proto::SERVER && n.state() == proto::ALIVE) {
      per_server[n.id()] = 0;
    }
  }
  if (per_server.empty()) return std::nullopt;
  auto weight = [&](const proto::TableMap& t, const proto::RangeAssignment& r) {
    auto it = load.find({t.spec().id(), r.begin()});
    return it == load.end() ? uint64_t{0} : it->second;
  };
  for (const proto::TableMap& t : map.tables()) {
    for (const proto::RangeAssignment& r : t.ranges()) {
      const uint64_t w = weight(t, r);
      auto add = [&](NodeId n) {
        auto it = per_server.find(n);
        if (it != per_server.end()) it->second += w;
      };
      add(r.primary());
      for (NodeId n : r.replicas()) add(n);
      for (NodeId n : r.catching_up()) add(n);
    }
  }
  uint64_t total = 0;
  NodeId busiest = kNoNode;
  for (const auto& [n, l] : per_server) {
    total += l;
    if (busiest == kNoNode || l > per_server[busiest] ||
        (l == per_server[busiest] && n < busiest)) {
      busiest = n;
    }
  }
  const double mean = static_cast<double>(total) / per_server.size();
  if (total == 0 || per_server[busiest] <= threshold * mean)
    return std::nullopt;
  std::optional<SplitChoice> best;
  uint64_t best_weight = 0;
  for (const proto::TableMap& t : map.tables()) {
    if (t.ranges_size() >= kMaxRangesPerTable) continue;
    for (const proto::RangeAssignment& r : t.ranges()) {
      const bool held = r.primary() == busiest ||
                        std::find(r.replicas().begin(), r.replicas().end(),
                                  busiest) != r.replicas().end();
      if (!held || !Busy(map, r).empty()) continue;
      auto k = split_keys.find({t.spec().id(), r.begin()});
      if (k == split_keys.end() || k->second <= r.begin() ||
          k->second >= r.end() || !UnevenCut(t.spec(), r, k->second).empty()) {
        continue;
      }
      const uint64_t w = weight(t, r);
      if (w == 0 || (best.has_value() && w <= best_weight)) continue;
      best = SplitChoice{t.spec().id(), r.begin(), k->second};
      best_weight = w;
    }
  }
  return best;
}

absl::StatusOr<proto::RangeAssignment> StartMerge(proto::ClusterMap* map,
                                                  TableId table, Key key,
                                                  Key* upper_end) {
  proto::TableMap* t = FindTable(map, table);
  if (t == nullptr) {
    return absl::NotFoundError(absl::StrCat("merge: no table ", table));
  }
  const std::string& name = t->spec().name();
  auto* ranges = t->mutable_ranges();
  for (int i = 0; i < ranges->size(); ++i) {
    proto::RangeAssignment& lo = *ranges->Mutable(i);
    if (key < lo.begin() || key >= lo.end()) continue;
    if (i + 1 == ranges->size()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "merge table '", name, "' at key ", key, ": [", lo.begin(), ", ",
          lo.end(), ") is its last range; name a key of the lower neighbour"));
    }
    proto::RangeAssignment& hi = *ranges->Mutable(i + 1);
    bool unavailable = false;
    const std::string why = CannotMerge(*map, lo, hi, &unavailable);
    if (!why.empty()) {
      const std::string msg =
          absl::StrCat("merge table '", name, "' at key ", hi.begin(), ": ",
                       why, unavailable ? "; retry once that is done" : "");
      return unavailable ? absl::UnavailableError(msg)
                         : absl::FailedPreconditionError(msg);
    }
    lo.set_merge(proto::RangeAssignment::MERGE_WITH_NEXT);
    hi.set_merge(proto::RangeAssignment::MERGE_WITH_PREVIOUS);
    *upper_end = hi.end();
    return lo;
  }
  return absl::OutOfRangeError(absl::StrCat("merge table '", name, "': key ",
                                            key, " is outside its key space"));
}

absl::StatusOr<Key> MergeLowerBegin(const proto::ClusterMap& map, TableId table,
                                    Key begin) {
  for (const proto::TableMap& t : map.tables()) {
    if (t.spec().id() != table) continue;
    for (int i = 0; i < t.ranges_size(); ++i) {
      const proto::RangeAssignment& r = t.ranges(i);
      if (r.begin() != begin) continue;
      if (r.merge() == proto::RangeAssignment::MERGE_WITH_NEXT) return begin;
      if (r.merge() == proto::RangeAssignment::MERGE_WITH_PREVIOUS && i > 0) {
        return t.ranges(i - 1).begin();
      }
      break;
    }
  }
  return absl::FailedPreconditionError(absl::StrCat(
      "table ", table, " range from key ", begin, ": no merge under way"));
}

absl::Status FinishMerge(proto::ClusterMap* map, TableId table, Key begin) {
  proto::TableMap* t = FindTable(map, table);
  auto* ranges = t == nullptr ? nullptr : t->mutable_ranges();
  for (int i = 0; ranges != nullptr && i + 1 < ranges->size(); ++i) {
    proto::RangeAssignment& lo = *ranges->Mutable(i);
    if (lo.begin() != begin) continue;
    const proto::RangeAssignment& hi = ranges->Get(i + 1);
    if (lo.merge() != proto::RangeAssignment::MERGE_WITH_NEXT ||
        hi.merge() != proto::RangeAssignment::MERGE_WITH_PREVIOUS) {
      break;
    }
    // Only as the merge could start now: a holder that died or a copy that
    // began since (a failover during the merge) leaves the ranges apart;
    // CancelStaleSplits then calls the merge off.
    proto::RangeAssignment a = lo, b = hi;
    a.clear_merge();
    b.clear_merge();
    bool unavailable = false;
    const std::string why = CannotMerge(*map, a, b, &unavailable);
    if (!why.empty()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "table ", table, " range from key ", begin, ": not merged: ", why));
    }
    // A table that aggregates BSP steps keeps each half's steps apart
    // (proto RangeAssignment.step_cuts).
    if (t->spec().sync_workers() > 0) {
      lo.add_step_cuts(lo.end());
      for (Key cut : hi.step_cuts()) lo.add_step_cuts(cut);
    }
    lo.set_end(hi.end());
    lo.clear_merge();
    ranges->DeleteSubrange(i + 1, 1);
    return absl::OkStatus();
  }
  return absl::FailedPreconditionError(
      absl::StrCat("table ", table, " range from key ", begin,
                   ": no merge with the next range under way"));
}

int MergesUnderWay(const proto::ClusterMap& map) {
  int n = 0;
  for (const proto::TableMap& t : map.tables()) {
    for (const proto::RangeAssignment& r : t.ranges()) {
      n += r.merge() == proto::RangeAssignment::MERGE_WITH_NEXT;
    }
  }
  return n;
}

std::optional<SplitChoice> PickMerge(
    const proto::ClusterMap& map,
    const absl::flat_hash_map<std::pair<TableId, Key>, uint64_t>& load,
    const absl::flat_hash_set<std::pair<TableId, Key>>& young,
    double threshold) {
  uint64_t total = 0;
  int count = 0;
  for (const proto::TableMap& t : map.tables()) {
    for (const proto::RangeAssignment& r : t.ranges()) {
      auto it = load.find({t.spec().id(), r.begin()});
      total += it == load.end() ? 0 : it->second;
      ++count;
    }
  }
  if (total == 0 || count == 0) return std::nullopt;
  const double limit = threshold * static_cast<double>(total) / count;
  std::optional<SplitChoice> best;
  uint64_t best_weight = 0;
  for (const proto::TableMap& t : map.tables()) {
    const TableId id = t.spec().id();
    for (int i = 0; i + 1 < t.ranges_size(); ++i) {
      const proto::RangeAssignment& lo = t.ranges(i);
      const proto::RangeAssignment& hi = t.ranges(i + 1);
      if (young.contains({id, hi.begin()})) continue;
      bool unavailable = false;
      if (!CannotMerge(map, lo, hi, &unavailable).empty()) continue;
      auto a = load.find({id, lo.begin()});
      auto b = load.find({id, hi.begin()});
      // Unmeasured is not cold.
      if (a == load.end() || b == load.end()) continue;
      const uint64_t w = a->second + b->second;
      if (static_cast<double>(w) > limit) continue;
      if (best.has_value() && w >= best_weight) continue;
      best = SplitChoice{id, lo.begin(), hi.begin()};
      best_weight = w;
    }
  }
  return best;
}

}  // namespace downpour
