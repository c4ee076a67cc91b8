#include "scheduler/moves.h"

#include <algorithm>
#include <vector>

#include "absl/strings/str_cat.h"
#include "scheduler/capacity.h"
#include "scheduler/placement.h"

namespace downpour {
namespace {

using Ids = google::protobuf::RepeatedField<uint64_t>;

bool Contains(const Ids& list, NodeId id) {
  return std::find(list.begin(), list.end(), id) != list.end();
}

bool Erase(Ids* list, NodeId id) {
  auto it = std::find(list->begin(), list->end(), id);
  if (it == list->end()) return false;
  list->erase(it);
  return true;
}

bool Holds(const proto::RangeAssignment& r, NodeId id) {
  return r.primary() == id || Contains(r.replicas(), id) ||
         Contains(r.catching_up(), id);
}

const proto::NodeInfo* Node(const proto::ClusterMap& map, NodeId id) {
  for (const proto::NodeInfo& n : map.nodes()) {
    if (n.id() == id) return &n;
  }
  return nullptr;
}

bool Alive(const proto::ClusterMap& map, NodeId id) {
  const proto::NodeInfo* n = Node(map, id);
  return n != nullptr && n->state() == proto::ALIVE;
}

// The bytes one holder of `r` keeps, or its load (at least 1).
uint64_t Weight(const proto::TableSpec& spec, const proto::RangeAssignment& r,
                const RangeSizes* sizes, MoveOptions::Balance by) {
  uint64_t w = by == MoveOptions::Balance::kBytes
                   ? RangeBytes(spec, r.begin(), r.end())
                   : 0;
  if (w == 0 && sizes != nullptr) {
    auto it = sizes->find({spec.id(), r.begin()});
    if (it != sizes->end()) w = it->second;
  }
  return std::max<uint64_t>(1, w);
}

int Holders(const proto::RangeAssignment& r) {
  return 1 + r.replicas_size() + r.catching_up_size();
}

// A range that may start a move: served, its primary alive, nothing under
// way on it, and all its holders there (a range short of them is refilled
// first: a move's source leaves it once the target is in sync, which must
// not leave it with fewer than r).
bool Movable(const proto::ClusterMap& map, const proto::RangeAssignment& r,
             int replicas) {
  return !r.lost() && r.move_to() == kNoNode && r.handing_to() == kNoNode &&
         r.split_at() == 0 && r.merge() == proto::RangeAssignment::NO_MERGE &&
         Alive(map, r.primary()) &&
         Holders(r) >= std::min<int>(std::max(1, replicas),
                                     static_cast<int>(LiveServers(map).size()));
}

struct Planner {
  proto::ClusterMap* map;
  const MoveOptions& options;
  absl::flat_hash_map<NodeId, uint64_t>* room;
  const absl::flat_hash_set<std::pair<NodeId, TableId>>* excluded;
  const RangeSizes* sizes;
  // Live servers that may receive ranges, and what each holds (bytes and
  // ranges; a move's source no longer counted, its target counted).
  std::vector<NodeId> receivers;
  absl::flat_hash_map<NodeId, uint64_t> bytes;
  absl::flat_hash_map<NodeId, int> ranges;
  // Per table, the ranges each server holds (counted the same way).
  absl::flat_hash_map<TableId, absl::flat_hash_map<NodeId, int>> per_table;
  int under_way = 0;

  void Count() {
    for (NodeId s : LiveServers(*map)) {
      if (!Draining(*map, s)) receivers.push_back(s);
      bytes[s] = 0;
      ranges[s] = 0;
    }
    for (const proto::TableMap& t : map->tables()) {
      for (const proto::RangeAssignment& r : t.ranges()) {
        if (r.move_to() != kNoNode) ++under_way;
        const uint64_t w = Weight(t.spec(), r, sizes, options.by);
        auto add = [&](NodeId s) {
          if (s == r.move_from() && r.move_to() != kNoNode) return;
          auto b = bytes.find(s);
          if (b == bytes.end()) return;
          b->second += w;
          ++ranges[s];
          ++per_table[t.spec().id()][s];
        };
        add(r.primary());
        for (NodeId s : r.replicas()) add(s);
        for (NodeId s : r.catching_up()) add(s);
      }
    }
  }

  bool Fits(NodeId s, TableId table, uint64_t w) const {
    if (excluded != nullptr && excluded->contains({s, table})) return false;
    if (room == nullptr) return true;
    auto left = room->find(s);
    return left == room->end() || left->second >= w;
  }

  // The receiver holding the least that can take `r`; kNoNode if none.
  NodeId Target(const proto::TableSpec& spec, const proto::RangeAssignment& r,
                uint64_t w) const {
    NodeId best = kNoNode;
    for (NodeId s : receivers) {
      if (Holds(r, s) || !Fits(s, spec.id(), w)) continue;
      if (best == kNoNode || bytes.at(s) < bytes.at(best) ||
          (bytes.at(s) == bytes.at(best) && ranges.at(s) < ranges.at(best))) {
        best = s;
      }
    }
    return best;
  }

  void Start(TableId table, proto::RangeAssignment* r, NodeId from, NodeId to,
             uint64_t w) {
    r->set_move_from(from);
    r->set_move_to(to);
    r->add_catching_up(to);
    bytes[to] += w;
    ++ranges[to];
    ++per_table[table][to];
    if (auto b = bytes.find(from); b != bytes.end()) {
      b->second -= std::min(b->second, w);
      --ranges[from];
      --per_table[table][from];
    }
    if (room != nullptr) {
      if (auto left = room->find(to); left != room->end()) {
        left->second -= std::min(left->second, w);
      }
    }
    ++under_way;
  }

  // Every range off the draining servers.
  bool Drain() {
    bool changed = false;
    for (proto::TableMap& t : *map->mutable_tables()) {
      for (proto::RangeAssignment& r : *t.mutable_ranges()) {
        // A copy not finished holds nothing the others lack: dropped.
        for (int i = r.catching_up_size() - 1; i >= 0; --i) {
          const NodeId s = r.catching_up(i);
          if (Draining(*map, s) && s != r.move_to()) {
            r.mutable_catching_up()->erase(r.mutable_catching_up()->begin() +
                                           i);
            changed = true;
          }
        }
        if (under_way >= options.max_moves ||
            !Movable(*map, r, options.replicas))
          continue;
        std::vector<NodeId> holders = {r.primary()};
        holders.insert(holders.end(), r.replicas().begin(), r.replicas().end());
        for (NodeId from : holders) {
          if (!Draining(*map, from)) continue;
          const uint64_t w = Weight(t.spec(), r, sizes, options.by);
          const NodeId to = Target(t.spec(), r, w);
          if (to == kNoNode) continue;  // nowhere to go now: later
          Start(t.spec().id(), &r, from, to, w);
          changed = true;
          break;  // one move at a time per range
        }
      }
    }
    return changed;
  }

  int Count(TableId table, NodeId s) {
    auto t = per_table.find(table);
    if (t == per_table.end()) return 0;
    auto c = t->second.find(s);
    return c == t->second.end() ? 0 : c->second;
  }

  // Balance::kBytes, first: per table, one range from the server holding
  // the most of it to the one holding the fewest, while they differ by two
  // or more (ties: by bytes held), so that every table's ranges (and so
  // its traffic) spread over the servers; false if none is that uneven.
  bool SpreadTableOnce() {
    if (receivers.size() < 2) return false;
    for (proto::TableMap& t : *map->mutable_tables()) {
      const TableId id = t.spec().id();
      NodeId from = kNoNode, to = kNoNode;
      for (NodeId s : receivers) {
        auto more = [&](NodeId a, NodeId b) {
          return Count(id, a) != Count(id, b) ? Count(id, a) > Count(id, b)
                                              : bytes[a] > bytes[b];
        };
        if (from == kNoNode || more(s, from)) from = s;
        if (to == kNoNode || more(to, s)) to = s;
      }
      if (Count(id, from) - Count(id, to) < 2) continue;
      for (proto::RangeAssignment& r : *t.mutable_ranges()) {
        if (!Movable(*map, r, options.replicas) || Holds(r, to)) continue;
        if (r.primary() != from && !Contains(r.replicas(), from)) continue;
        const uint64_t w = Weight(t.spec(), r, sizes, options.by);
        if (!Fits(to, id, w)) continue;
        Start(id, &r, from, to, w);
        return true;
      }
    }
    return false;
  }

  // Then one move from the fullest server (bytes, or load) that has a
  // range to give to the emptiest, while the fullest is more than the
  // tolerance above the mean, never overshooting; under kBytes only of a
  // table the giver holds more of (the tables stay spread). False if there
  // is none.
  bool BalanceOnce() {
    if (receivers.size() < 2) return false;
    {
      // Relieve only a server clearly above the mean: sparse sizes grow
      // and loads are noisy, and a move costs a copy.
      double total = 0, most = 0;
      for (NodeId s : receivers) {
        total += bytes[s];
        most = std::max<double>(most, bytes[s]);
      }
      const double mean = total / receivers.size();
      if (most <= mean * (1 + options.tolerance)) return false;
    }
    std::vector<NodeId> donors = receivers;
    std::sort(donors.begin(), donors.end(), [&](NodeId a, NodeId b) {
      return bytes[a] != bytes[b] ? bytes[a] > bytes[b] : a < b;
    });
    NodeId to = donors.back();
    for (NodeId s : donors) {
      if (bytes[s] == bytes[to] && ranges[s] < ranges[to]) to = s;
    }
    const bool by_bytes = options.by == MoveOptions::Balance::kBytes;
    for (NodeId from : donors) {
      if (from == to || bytes[from] <= bytes[to]) break;
      const uint64_t gap = bytes[from] - bytes[to];
      proto::RangeAssignment* best = nullptr;
      TableId best_table = kNoTable;
      uint64_t best_w = 0;
      for (proto::TableMap& t : *map->mutable_tables()) {
        const TableId id = t.spec().id();
        if (by_bytes && Count(id, from) <= Count(id, to)) continue;
        for (proto::RangeAssignment& r : *t.mutable_ranges()) {
          if (!Movable(*map, r, options.replicas) || Holds(r, to)) continue;
          if (r.primary() != from && !Contains(r.replicas(), from)) continue;
          const uint64_t w = Weight(t.spec(), r, sizes, options.by);
          if (w > gap / 2 || w <= best_w || !Fits(to, id, w)) continue;
          best = &r;
          best_table = id;
          best_w = w;
        }
      }
      if (best != nullptr) {
        Start(best_table, best, from, to, best_w);
        return true;
      }
    }
    return false;
  }
};

}  // namespace

bool Draining(const proto::ClusterMap& map, NodeId server) {
  const proto::NodeInfo* n = Node(map, server);
  return n != nullptr && n->state() == proto::ALIVE && n->draining();
}

bool StartMoves(proto::ClusterMap* map, const MoveOptions& options,
                absl::flat_hash_map<NodeId, uint64_t>* room,
                const absl::flat_hash_set<std::pair<NodeId, TableId>>* excluded,
                const RangeSizes* sizes) {
  Planner p{map, options, room, excluded, sizes};
  p.Count();
  bool changed = p.Drain();
  if (!options.balance) return changed;
  if (options.by == MoveOptions::Balance::kBytes) {
    while (p.under_way < options.max_moves && p.SpreadTableOnce()) {
      changed = true;
    }
  }
  while (p.under_way < options.max_moves && p.BalanceOnce()) changed = true;
  return changed;
}

bool SettleMoves(
    proto::ClusterMap* map, int replicas,
    const absl::flat_hash_set<std::pair<TableId, Key>>* no_handover) {
  bool changed = false;
  for (proto::TableMap& t : *map->mutable_tables()) {
    for (proto::RangeAssignment& r : *t.mutable_ranges()) {
      if (r.move_to() == kNoNode) continue;
      const NodeId from = r.move_from(), to = r.move_to();
      auto done = [&] {
        r.clear_move_from();
        r.clear_move_to();
        changed = true;
      };
      if (!Alive(*map, to) || !Holds(r, to) || r.lost()) {
        // The target is gone: the old holders keep the range.
        if (r.handing_to() == to) r.clear_handing_to();
        Erase(r.mutable_catching_up(), to);
        done();
        continue;
      }
      if (!Holds(r, from)) {  // the source left (died): to stays a backup
        done();
        continue;
      }
      if (r.primary() == to ||
          (Contains(r.replicas(), to) && r.primary() != from)) {
        // The target holds everything and the source is a backup: it
        // leaves, unless the range would be left short of r holders (it
        // lost one meanwhile): then it stays, an ordinary backup.
        if (Holders(r) - 1 >= std::max(1, replicas)) {
          Erase(r.mutable_replicas(), from);
          Erase(r.mutable_catching_up(), from);
        }
        done();
        continue;
      }
      if (Contains(r.replicas(), to) && r.handing_to() == kNoNode &&
          Alive(*map, from) &&
          (no_handover == nullptr ||
           !no_handover->contains({t.spec().id(), r.begin()}))) {
        r.set_handing_to(to);  // the source is the primary
        changed = true;
      }
    }
  }
  return changed;
}

bool CancelMovesFrom(proto::ClusterMap* map, NodeId server) {
  bool changed = false;
  for (proto::TableMap& t : *map->mutable_tables()) {
    for (proto::RangeAssignment& r : *t.mutable_ranges()) {
      if (r.move_to() == kNoNode || r.move_from() != server) continue;
      const NodeId to = r.move_to();
      if (r.primary() != to) {
        if (r.handing_to() == to) r.clear_handing_to();
        Erase(r.mutable_catching_up(), to);
        Erase(r.mutable_replicas(), to);
      }
      r.clear_move_from();
      r.clear_move_to();
      changed = true;
    }
  }
  return changed;
}

int MovesUnderWay(const proto::ClusterMap& map) {
  int n = 0;
  for (const proto::TableMap& t : map.tables()) {
    for (const proto::RangeAssignment& r : t.ranges()) {
      n += r.move_to() != kNoNode;
    }
  }
  return n;
}

int RangesHeld(const proto::ClusterMap& map, NodeId server) {
  int n = 0;
  for (const proto::TableMap& t : map.tables()) {
    for (const proto::RangeAssignment& r : t.ranges()) n += Holds(r, server);
  }
  return n;
}

int MovesFrom(const proto::ClusterMap& map, NodeId server) {
  int n = 0;
  for (const proto::TableMap& t : map.tables()) {
    for (const proto::RangeAssignment& r : t.ranges()) {
      n += r.move_to() != kNoNode && r.move_from() == server;
    }
  }
  return n;
}

absl::Status CheckDrainable(const proto::ClusterMap& map, NodeId server,
                            int replicas) {
  int others = 0;
  for (NodeId s : LiveServers(map)) {
    others += s != server && !Draining(map, s);
  }
  const int need = std::max(1, replicas);
  if (others >= need) return absl::OkStatus();
  const proto::NodeInfo* n = Node(map, server);
  return absl::FailedPreconditionError(absl::StrCat(
      "cannot drain server ", server, " ('", n == nullptr ? "" : n->name(),
      "'): ", others, " other live server(s) would be left to hold its ",
      RangesHeld(map, server), " range(s), and each range needs ", need,
      " holder(s) (--replicas); add a server first"));
}

}  // namespace downpour
