#include "scheduler/placement.h"

#include <algorithm>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "scheduler/capacity.h"

namespace downpour {
namespace {

bool Erase(google::protobuf::RepeatedField<uint64_t>* list, NodeId id) {
  auto it = std::find(list->begin(), list->end(), id);
  if (it == list->end()) return false;
  list->erase(it);
  return true;
}

bool Holds(const proto::RangeAssignment& r, NodeId id) {
  return r.primary() == id ||
         std::find(r.replicas().begin(), r.replicas().end(), id) !=
             r.replicas().end() ||
         std::find(r.catching_up().begin(), r.catching_up().end(), id) !=
             r.catching_up().end();
}

bool Alive(const proto::ClusterMap& map, NodeId id) {
  for (const proto::NodeInfo& n : map.nodes()) {
    if (n.id() == id) return n.state() == proto::ALIVE;
  }
  return false;
}

// Being drained: it takes on no range (moves.h).
bool Draining(const proto::ClusterMap& map, NodeId id) {
  for (const proto::NodeInfo& n : map.nodes()) {
    if (n.id() == id) return n.draining();
  }
  return false;
}

// A handover stands only while its primary is alive and its target is
// still an in-sync backup.
bool CancelStaleHandOver(const proto::ClusterMap& map,
                         proto::RangeAssignment* r) {
  if (r->handing_to() == kNoNode) return false;
  const bool target_in_sync =
      std::find(r->replicas().begin(), r->replicas().end(), r->handing_to()) !=
      r->replicas().end();
  if (target_in_sync && Alive(map, r->primary()) &&
      Alive(map, r->handing_to()) && !r->lost()) {
    return false;
  }
  r->clear_handing_to();
  return true;
}

// `server` leaves the range: a handover from or to it is cancelled.
bool CancelHandOverOf(proto::RangeAssignment* r, NodeId server) {
  if (r->handing_to() == kNoNode ||
      (r->primary() != server && r->handing_to() != server)) {
    return false;
  }
  r->clear_handing_to();
  return true;
}

}  // namespace

std::vector<NodeId> LiveServers(const proto::ClusterMap& map) {
  std::vector<NodeId> out;
  for (const proto::NodeInfo& n : map.nodes()) {
    if (n.role() == proto::SERVER && n.state() == proto::ALIVE) {
      out.push_back(n.id());
    }
  }
  std::sort(out.begin(), out.end());
  return out;
}

void PlaceTable(proto::TableMap* table, const std::vector<NodeId>& servers,
                int replicas, int min_ranges) {
  const Key end = table->spec().kind() == proto::DENSE
                      ? table->spec().num_keys()
                      : kKeySpaceEnd;
  const size_t n = servers.size();
  const size_t parts = static_cast<size_t>(
      std::min<unsigned __int128>(std::max<size_t>(n, std::max(0, min_ranges)),
                                  static_cast<unsigned __int128>(end)));
  const size_t holders = std::min<size_t>(n, std::max(1, replicas));
  Key begin = 0;
  for (size_t i = 0; i < parts; ++i) {
    const Key next =
        static_cast<Key>(static_cast<unsigned __int128>(end) * (i + 1) / parts);
    proto::RangeAssignment* r = table->add_ranges();
    r->set_begin(begin);
    r->set_end(next);
    r->set_primary(servers[i % n]);
    for (size_t k = 1; k < holders; ++k) {
      r->add_replicas(servers[(i + k) % n]);
    }
    begin = next;
  }
}

bool RemoveServer(proto::ClusterMap* map, NodeId dead) {
  bool changed = false;
  for (proto::TableMap& t : *map->mutable_tables()) {
    for (proto::RangeAssignment& r : *t.mutable_ranges()) {
      changed |= Erase(r.mutable_catching_up(), dead);
      changed |= Erase(r.mutable_replicas(), dead);
      changed |= CancelHandOverOf(&r, dead);
      if (r.primary() != dead) continue;
      // The first in-sync backup that is alive takes over.
      NodeId next = kNoNode;
      for (NodeId b : r.replicas()) {
        if (Alive(*map, b)) {
          next = b;
          break;
        }
      }
      if (next == kNoNode) continue;  // nobody holds the data: keep waiting
      Erase(r.mutable_replicas(), next);
      r.set_primary(next);
      // The other backups may hold a different prefix of the dead
      // primary's writes: they start over from a copy of the new one.
      for (NodeId b : r.replicas()) r.add_catching_up(b);
      r.clear_replicas();
      changed = true;
    }
  }
  return changed;
}

bool ForgetServerData(proto::ClusterMap* map, NodeId server) {
  bool changed = false;
  for (proto::TableMap& t : *map->mutable_tables()) {
    for (proto::RangeAssignment& r : *t.mutable_ranges()) {
      changed |= Erase(r.mutable_catching_up(), server);
      changed |= Erase(r.mutable_replicas(), server);
      changed |= CancelHandOverOf(&r, server);
      if (r.primary() == server && !r.lost()) {
        r.set_lost(true);
        changed = true;
      }
    }
  }
  return changed;
}

bool Refill(proto::ClusterMap* map, int replicas,
            absl::flat_hash_map<NodeId, uint64_t>* room,
            const absl::flat_hash_set<std::pair<NodeId, TableId>>* excluded) {
  const std::vector<NodeId> live = LiveServers(*map);
  if (live.empty()) return false;
  absl::flat_hash_map<NodeId, int> load;
  for (NodeId s : live) load[s] = 0;
  for (const proto::TableMap& t : map->tables()) {
    for (const proto::RangeAssignment& r : t.ranges()) {
      for (NodeId s : live) {
        if (Holds(r, s)) ++load[s];
      }
    }
  }
  bool changed = false;
  for (proto::TableMap& t : *map->mutable_tables()) {
    const TableId table = t.spec().id();
    for (proto::RangeAssignment& r : *t.mutable_ranges()) {
      if (r.lost() || !Alive(*map, r.primary())) continue;
      const uint64_t bytes = room == nullptr ? 0 : HeldBytes(t, r);
      auto fits = [&](NodeId s) {
        if (excluded != nullptr && excluded->contains({s, table})) {
          return false;
        }
        if (room == nullptr) return true;
        auto left = room->find(s);
        return left == room->end() || left->second >= bytes;
      };
      while (1 + r.replicas_size() + r.catching_up_size() < replicas) {
        NodeId best = kNoNode;
        for (NodeId s : live) {
          if (Holds(r, s) || !fits(s) || Draining(*map, s)) continue;
          if (best == kNoNode || load[s] < load[best]) best = s;
        }
        // Every live server holds it already, or has no room for it.
        if (best == kNoNode) break;
        r.add_catching_up(best);
        ++load[best];
        if (room != nullptr) {
          if (auto left = room->find(best); left != room->end()) {
            left->second -= bytes;
          }
        }
        changed = true;
      }
    }
  }
  return changed;
}

bool DropCatchingUp(proto::ClusterMap* map, TableId table, NodeId server) {
  bool changed = false;
  for (proto::TableMap& t : *map->mutable_tables()) {
    if (t.spec().id() != table) continue;
    for (proto::RangeAssignment& r : *t.mutable_ranges()) {
      changed |= Erase(r.mutable_catching_up(), server);
    }
  }
  return changed;
}

bool HoldsAnyRange(const proto::ClusterMap& map, NodeId server) {
  for (const proto::TableMap& t : map.tables()) {
    for (const proto::RangeAssignment& r : t.ranges()) {
      if (Holds(r, server)) return true;
    }
  }
  return false;
}

absl::Status MarkInSync(proto::ClusterMap* map, TableId table, Key begin,
                        NodeId primary, NodeId backup) {
  for (proto::TableMap& t : *map->mutable_tables()) {
    if (t.spec().id() != table) continue;
    for (proto::RangeAssignment& r : *t.mutable_ranges()) {
      if (r.begin() != begin) continue;
      if (r.primary() != primary) {
        return absl::FailedPreconditionError(absl::StrCat(
            "table ", table, " range from key ", begin, ": node ", primary,
            " is not its primary (", r.primary(), " is)"));
      }
      if (!Erase(r.mutable_catching_up(), backup)) {
        return absl::FailedPreconditionError(
            absl::StrCat("table ", table, " range from key ", begin, ": node ",
                         backup, " is not catching up on it"));
      }
      r.add_replicas(backup);
      return absl::OkStatus();
    }
  }
  return absl::FailedPreconditionError(
      absl::StrCat("table ", table, " has no range beginning at key ", begin));
}

bool BalancePrimaries(proto::ClusterMap* map) {
  const std::vector<NodeId> live = LiveServers(*map);
  bool changed = false;
  for (proto::TableMap& t : *map->mutable_tables()) {
    // Primaries per live server, a handover under way counted at its
    // target already.
    absl::flat_hash_map<NodeId, int> count;
    for (NodeId s : live) count[s] = 0;
    for (proto::RangeAssignment& r : *t.mutable_ranges()) {
      changed |= CancelStaleHandOver(*map, &r);
      const NodeId owner =
          r.handing_to() != kNoNode ? r.handing_to() : r.primary();
      if (auto c = count.find(owner); c != count.end()) ++c->second;
    }
    for (proto::RangeAssignment& r : *t.mutable_ranges()) {
      // A moving range's handover is its move's (moves.h).
      if (r.lost() || r.handing_to() != kNoNode || r.move_to() != kNoNode ||
          r.split_at() != 0 || r.merge() != proto::RangeAssignment::NO_MERGE) {
        continue;
      }
      auto from = count.find(r.primary());
      if (from == count.end()) continue;  // its primary is not alive
      NodeId best = kNoNode;
      for (NodeId b : r.replicas()) {
        auto c = count.find(b);
        if (c == count.end() || Draining(*map, b)) continue;
        if (best == kNoNode || c->second < count[best]) best = b;
      }
      if (best == kNoNode || from->second - count[best] < 2) continue;
      r.set_handing_to(best);
      --from->second;
      ++count[best];
      changed = true;
    }
  }
  return changed;
}

absl::Status HandOver(proto::ClusterMap* map, TableId table, Key begin,
                      NodeId primary, NodeId to) {
  for (proto::TableMap& t : *map->mutable_tables()) {
    if (t.spec().id() != table) continue;
    for (proto::RangeAssignment& r : *t.mutable_ranges()) {
      if (r.begin() != begin) continue;
      if (r.primary() != primary || r.handing_to() != to || to == kNoNode) {
        return absl::FailedPreconditionError(absl::StrCat(
            "table ", table, " range from key ", begin, ": no handover from ",
            primary, " to ", to, " under way (primary ", r.primary(),
            ", handing to ", r.handing_to(), ")"));
      }
      auto it = std::find(r.mutable_replicas()->begin(),
                          r.mutable_replicas()->end(), to);
      if (it == r.mutable_replicas()->end()) {
        return absl::FailedPreconditionError(
            absl::StrCat("table ", table, " range from key ", begin, ": node ",
                         to, " is not an in-sync backup of it"));
      }
      *it = primary;
      r.set_primary(to);
      r.clear_handing_to();
      return absl::OkStatus();
    }
  }
  return absl::FailedPreconditionError(
      absl::StrCat("table ", table, " has no range beginning at key ", begin));
}

bool HandOversUnderWay(const proto::ClusterMap& map) {
  for (const proto::TableMap& t : map.tables()) {
    for (const proto::RangeAssignment& r : t.ranges()) {
      if (r.handing_to() != kNoNode) return true;
    }
  }
  return false;
}

bool CancelHandOvers(proto::ClusterMap* map) {
  bool changed = false;
  for (proto::TableMap& t : *map->mutable_tables()) {
    for (proto::RangeAssignment& r : *t.mutable_ranges()) {
      if (r.handing_to() == kNoNode) continue;
      r.clear_handing_to();
      changed = true;
    }
  }
  return changed;
}

}  // namespace downpour
