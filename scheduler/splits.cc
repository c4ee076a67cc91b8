#include "scheduler/splits.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

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

}  // namespace

absl::StatusOr<proto::RangeAssignment> StartSplit(proto::ClusterMap* map,
                                                  TableId table, Key key) {
  proto::TableMap* t = FindTable(map, table);
  if (t == nullptr) {
    return absl::NotFoundError(absl::StrCat("split: no table ", table));
  }
  const std::string& name = t->spec().name();
  if (Bounded(t->spec())) {
    return absl::FailedPreconditionError(absl::StrCat(
        "split table '", name,
        "': it is a bounded sparse table, whose row cap is divided over its "
        "ranges; its ranges are not split"));
  }
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
      if (r.split_at() == 0) continue;
      r.clear_split_at();
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
    if (Bounded(t.spec()) || t.ranges_size() >= kMaxRangesPerTable) continue;
    for (const proto::RangeAssignment& r : t.ranges()) {
      const bool held = r.primary() == busiest ||
                        std::find(r.replicas().begin(), r.replicas().end(),
                                  busiest) != r.replicas().end();
      if (!held || !Busy(map, r).empty()) continue;
      auto k = split_keys.find({t.spec().id(), r.begin()});
      if (k == split_keys.end() || k->second <= r.begin() ||
          k->second >= r.end()) {
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

}  // namespace downpour
