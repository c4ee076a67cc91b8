#include "scheduler/membership.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "scheduler/placement.h"
#include "scheduler/request_checks.h"

namespace downpour {

proto::NodeInfo* Membership::Find(NodeId id) {
  for (auto& n : *map_->mutable_nodes()) {
    if (n.id() == id) return &n;
  }
  return nullptr;
}

const proto::NodeInfo* Membership::Find(NodeId id) const {
  for (const auto& n : map_->nodes()) {
    if (n.id() == id) return &n;
  }
  return nullptr;
}

const proto::NodeInfo* Membership::FindByName(const std::string& name,
                                              proto::NodeRole role) const {
  for (const auto& n : map_->nodes()) {
    if (n.name() == name && n.role() == role) return &n;
  }
  return nullptr;
}

std::vector<const proto::NodeInfo*> Membership::AliveServers() const {
  std::vector<const proto::NodeInfo*> out;
  for (const auto& n : map_->nodes()) {
    if (n.role() == proto::SERVER && n.state() == proto::ALIVE) {
      out.push_back(&n);
    }
  }
  return out;
}

proto::NodeInfo* Membership::Registered(const proto::RegisterRequest& req) {
  proto::NodeInfo* node = nullptr;
  if (!req.name().empty()) {
    for (auto& n : *map_->mutable_nodes()) {
      if (n.name() == req.name() && n.role() == req.role()) node = &n;
    }
  }
  return node;
}

bool Membership::SameProcess(const proto::NodeInfo* node,
                             const proto::RegisterRequest& req) {
  return node != nullptr && node->state() == proto::ALIVE &&
         req.incarnation() != 0 && req.incarnation() == node->incarnation();
}

absl::Status Membership::CheckRoom(const proto::RegisterRequest& req,
                                   const proto::NodeInfo* same) const {
  if (same == nullptr && map_->nodes_size() >= options_.max_nodes) {
    return absl::ResourceExhaustedError(
        absl::StrCat("register '", req.name(), "': the cluster lists ",
                     map_->nodes_size(), " nodes, at most ", options_.max_nodes,
                     " (dead ones are forgotten after ",
                     absl::FormatDuration(options_.forget_dead_after), ")"));
  }
  proto::NodeInfo entry;
  entry.set_id(next_node_id_);
  entry.set_role(req.role());
  entry.set_state(proto::ALIVE);
  entry.set_name(req.name());
  entry.set_data_endpoint(req.data_endpoint());
  entry.set_admin_address(req.admin_address());
  entry.mutable_plugin_handlers()->CopyFrom(req.plugin_handlers());
  entry.set_incarnation(req.incarnation());
  entry.set_max_message_bytes(req.max_message_bytes());
  entry.set_memory_limit_bytes(req.memory_limit_bytes());
  const size_t now = map_->ByteSizeLong();
  const size_t old = same == nullptr ? 0 : same->ByteSizeLong();
  return CheckMapGrowth(absl::StrCat("register '", req.name(), "'"),
                        now - std::min(now, old), entry.ByteSizeLong() + 16,
                        options_.max_map_bytes);
}

proto::NodeInfo* Membership::Add(NodeId previous) {
  const bool free = previous != kNoNode && Find(previous) == nullptr;
  proto::NodeInfo* node = map_->add_nodes();
  if (free) {
    node->set_id(previous);
    next_node_id_ = std::max(next_node_id_, previous + 1);
  } else {
    node->set_id(next_node_id_++);
  }
  return node;
}

void Membership::Admit(proto::NodeInfo* node, const proto::RegisterRequest& req,
                       absl::Time now) {
  node->set_role(req.role());
  node->set_state(proto::ALIVE);
  node->set_name(req.name());
  node->set_data_endpoint(req.data_endpoint());
  node->set_admin_address(req.admin_address());
  node->mutable_plugin_handlers()->CopyFrom(req.plugin_handlers());
  node->set_incarnation(req.incarnation());
  node->set_max_message_bytes(req.max_message_bytes());
  node->set_memory_limit_bytes(req.memory_limit_bytes());
  // A server registering anew (e.g. a drained pod restarted) takes ranges
  // again.
  node->set_draining(false);
  last_seen_[node->id()] = now;
  suspect_since_.erase(node->id());
  unconfirmed_.erase(node->id());
  applied_[node->id()] = 0;
}

void Membership::Heard(NodeId id, absl::Time now) {
  last_seen_[id] = now;
  unconfirmed_.erase(id);
}

void Membership::RecordApplied(NodeId id, Epoch epoch) {
  applied_[id] = std::max(applied_[id], epoch);
}

Epoch Membership::applied(NodeId id) const {
  const auto it = applied_.find(id);
  return it == applied_.end() ? 0 : it->second;
}

void Membership::MarkDead(proto::NodeInfo* node) {
  node->set_state(proto::DEAD);
  if (node->role() == proto::WORKER) ++workers_declared_dead_;
  if (node->role() == proto::SERVER) ++servers_declared_dead_;
}

void Membership::MarkLeft(proto::NodeInfo* node) {
  node->set_state(proto::LEFT);
  suspect_since_.erase(node->id());
}

void Membership::Suspect(NodeId id, const std::string& why, absl::Time now) {
  const proto::NodeInfo* n = Find(id);
  if (n == nullptr || n->state() != proto::ALIVE) return;
  if (n->role() != proto::SERVER && n->role() != proto::WORKER) return;
  if (suspect_since_.emplace(id, std::make_pair(now, why)).second) {
    DP_LOG(INFO) << "node " << id << " ('" << n->name()
                 << "') reported unreachable: " << why;
  }
}

std::vector<NodeId> Membership::SweepDead(absl::Time now) {
  if (last_sweep_ != absl::InfinitePast() &&
      now - last_sweep_ > options_.sweep_stall) {
    // Heartbeats could not be heard meanwhile: a loaded machine's stall
    // would otherwise declare every node dead at once (and, with a broken
    // stream reported just before, within a 400 ms grace).
    const absl::Duration gap = now - last_sweep_;
    for (auto& [id, seen] : last_seen_) seen = std::min(seen + gap, now);
    for (auto& [id, since] : suspect_since_) {
      since.first = std::min(since.first + gap, now);
    }
    DP_LOG(WARNING) << "the scheduler did not sweep for "
                    << absl::FormatDuration(gap)
                    << " (starved of CPU or stopped): that long is not "
                    << "counted as any node's silence";
  }
  last_sweep_ = now;
  std::vector<NodeId> dead;
  for (auto& n : *map_->mutable_nodes()) {
    if (n.state() != proto::ALIVE) continue;
    // Clients are forgotten instead (ForgetSilent).
    if (n.role() != proto::SERVER && n.role() != proto::WORKER) continue;
    const absl::Time seen = last_seen_[n.id()];
    std::string why;
    if (now - seen > options_.dead_after) {
      why = absl::StrCat("missed heartbeats for ",
                         absl::FormatDuration(now - seen));
    } else if (auto s = suspect_since_.find(n.id());
               s != suspect_since_.end() && seen < s->second.first &&
               now - s->second.first > options_.suspect_grace) {
      why = absl::StrCat("unreachable (", s->second.second, ") and silent for ",
                         absl::FormatDuration(now - seen));
    } else {
      continue;
    }
    MarkDead(&n);
    dead.push_back(n.id());
    unconfirmed_.erase(n.id());
    DP_LOG(WARNING) << "node " << n.id() << " ('" << n.name() << "') " << why
                    << "; declared dead";
  }
  for (NodeId id : dead) suspect_since_.erase(id);
  return dead;
}

std::vector<NodeId> Membership::ForgetSilent(absl::Time now) {
  std::vector<NodeId> gone;
  for (const proto::NodeInfo& n : map_->nodes()) {
    const absl::Duration silent = now - last_seen_[n.id()];
    const bool client = n.role() == proto::CLIENT;
    const bool gone_node = n.state() == proto::DEAD || n.state() == proto::LEFT;
    if (client ? silent > options_.dead_after
               : gone_node && silent > options_.forget_dead_after &&
                     !HoldsAnyRange(*map_, n.id())) {
      gone.push_back(n.id());
    }
  }
  for (NodeId id : gone) {
    auto* nodes = map_->mutable_nodes();
    for (int i = 0; i < nodes->size(); ++i) {
      if (nodes->Get(i).id() != id) continue;
      DP_LOG(INFO) << proto::NodeRole_Name(nodes->Get(i).role()) << " " << id
                   << " ('" << nodes->Get(i).name()
                   << "') silent for long: forgotten";
      nodes->erase(nodes->begin() + i);
      break;
    }
    last_seen_.erase(id);
    applied_.erase(id);
    suspect_since_.erase(id);
    unconfirmed_.erase(id);
  }
  return gone;
}

void Membership::Recovered(NodeId next_node_id, absl::Time now) {
  next_node_id_ = std::max<NodeId>(1, next_node_id);
  for (const auto& n : map_->nodes()) {
    if (n.state() != proto::ALIVE) continue;
    last_seen_[n.id()] = now;
    if (n.role() == proto::SERVER) unconfirmed_.insert(n.id());
  }
}

}  // namespace downpour
