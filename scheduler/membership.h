// The cluster's nodes (ClusterMap.nodes): ids, registration, heartbeats,
// suspicion, and the failure sweep's decisions: which nodes are dead and
// which are forgotten. What a death means for ranges, ranks and tables is
// the caller's to apply (node_lifecycle.h).
//
//   Membership members(options, &map);
//   proto::NodeInfo* n = members.Add(req.previous_id());
//   members.Admit(n, req, now);                    // Register
//   members.Heard(id, now);                        // Heartbeat
//   members.Suspect(id, "its stream broke", now);  // a peer's report
//   for (NodeId id : members.SweepDead(now)) ...   // now DEAD
//   for (NodeId id : members.ForgetSilent(now)) ...  // gone from the map
//
// The rules: a SERVER or WORKER silent for `dead_after`, or reported
// unreachable and silent for `suspect_grace` since the report, is marked
// DEAD. A CLIENT silent for `dead_after` is forgotten (removed from the map)
// at once: it holds no data and no rank; a DEAD or LEFT node once silent for
// `forget_dead_after` and named by no range. Silence counts only while
// the scheduler runs: sweeps further apart than `sweep_stall` mean that it
// did not (starved of CPU, stopped, its lock held), and could hear nobody,
// so the gap is credited to every node (its silence and its grace resume
// where they were). Time is an argument everywhere, so that the rules can
// be tested with a fake clock.
//
// Thread-compatible: the scheduler's mutex guards it and the map.
#ifndef DOWNPOUR_SCHEDULER_MEMBERSHIP_H_
#define DOWNPOUR_SCHEDULER_MEMBERSHIP_H_

#include <cstdint>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/time/time.h"
#include "common/types.h"
#include "proto/downpour.pb.h"

namespace downpour {

struct MembershipOptions {
  absl::Duration dead_after = absl::Seconds(3);
  absl::Duration suspect_grace = absl::Milliseconds(400);
  absl::Duration forget_dead_after = absl::Minutes(10);
  // Caps on the map a registration may grow: nodes listed, serialized size.
  int max_nodes = 4096;
  size_t max_map_bytes = size_t{1} << 20;
  // Sweeps further apart than this are a stall of the scheduler's own (see
  // above). Infinite: no credit (callers that sweep irregularly, tests).
  absl::Duration sweep_stall = absl::InfiniteDuration();
};

class Membership {
 public:
  // `map` (borrowed, must outlive this object) holds the nodes.
  Membership(const MembershipOptions& options, proto::ClusterMap* map)
      : options_(options), map_(map) {}

  // nullptr if the map does not list `id`.
  proto::NodeInfo* Find(NodeId id);
  const proto::NodeInfo* Find(NodeId id) const;
  // The first node named `name` with `role`, nullptr if none.
  const proto::NodeInfo* FindByName(const std::string& name,
                                    proto::NodeRole role) const;
  // ALIVE servers, in map order.
  std::vector<const proto::NodeInfo*> AliveServers() const;

  // --- Registration ---
  // The node `req` registers again as (same name and role), nullptr for a
  // new name or an unnamed node.
  proto::NodeInfo* Registered(const proto::RegisterRequest& req);
  // Whether `req` comes from the process `node` already is (ALIVE, same
  // non-zero incarnation): a retry whose reply was lost.
  static bool SameProcess(const proto::NodeInfo* node,
                          const proto::RegisterRequest& req);
  // A registration adds at most one node: the node cap, and the map's size
  // with `req`'s entry (replacing `same`, its earlier one, if any).
  // kResourceExhausted.
  absl::Status CheckRoom(const proto::RegisterRequest& req,
                         const proto::NodeInfo* same) const;
  // A new entry: id `previous` if nobody holds it (a node that had it from
  // a scheduler that lost its state), else a fresh one. Ids stay unique.
  proto::NodeInfo* Add(NodeId previous);
  // `node` registered with `req` at `now`: ALIVE with the request's fields,
  // heard from, not suspect, no epoch applied yet.
  void Admit(proto::NodeInfo* node, const proto::RegisterRequest& req,
             absl::Time now);

  // --- Liveness ---
  void Heard(NodeId id, absl::Time now);
  void RecordApplied(NodeId id, Epoch epoch);
  // The newest epoch `id` acknowledged (0 if none).
  Epoch applied(NodeId id) const;
  // Marks `node` DEAD (counted). A server must then leave its ranges.
  void MarkDead(proto::NodeInfo* node);
  // A worker that left: LEFT, no longer suspect.
  void MarkLeft(proto::NodeInfo* node);
  // Starts the grace after which an unreachable SERVER or WORKER is
  // declared dead unless heard from meanwhile. Ignored for other nodes.
  void Suspect(NodeId id, const std::string& why, absl::Time now);

  // --- The sweep ---
  // Marks DEAD the ALIVE servers and workers silent too long (see above) and
  // returns them, in map order.
  std::vector<NodeId> SweepDead(absl::Time now);
  // Removes from the map the nodes to forget (see above) and everything
  // kept about them here; returns their ids, for the other parts to forget
  // them too.
  std::vector<NodeId> ForgetSilent(absl::Time now);

  // --- State ---
  NodeId next_node_id() const { return next_node_id_; }
  // Loaded from disk with the map: every ALIVE node gets a full dead_after
  // from `now`, and the ALIVE servers are unconfirmed until heard from.
  void Recovered(NodeId next_node_id, absl::Time now);
  // Servers recovered as ALIVE not heard from since.
  size_t unconfirmed() const { return unconfirmed_.size(); }

  uint64_t servers_declared_dead() const { return servers_declared_dead_; }
  uint64_t workers_declared_dead() const { return workers_declared_dead_; }

 private:
  const MembershipOptions options_;
  proto::ClusterMap* const map_;
  NodeId next_node_id_ = 1;
  absl::flat_hash_map<NodeId, absl::Time> last_seen_;
  // Nodes reported unreachable: since when, and why.
  absl::flat_hash_map<NodeId, std::pair<absl::Time, std::string>>
      suspect_since_;
  absl::flat_hash_map<NodeId, Epoch> applied_;
  std::set<NodeId> unconfirmed_;
  absl::Time last_sweep_ = absl::InfinitePast();
  uint64_t servers_declared_dead_ = 0;
  uint64_t workers_declared_dead_ = 0;
};

}  // namespace downpour

#endif  // DOWNPOUR_SCHEDULER_MEMBERSHIP_H_
