// The scheduler's side of checkpoints and restores: the calls to the servers
// and the checks on what they report. The scheduler decides when (its
// triggers, its lock) and keeps the manifests; this does the blocking
// work, without the scheduler's lock.
//
// A checkpoint (docs/ARCHITECTURE.md, "Checkpoints"):
//   1. BSP: every server reports the next clocks of its BSP parts (PROBE);
//      the cut clock C is the largest (plus `clock_offset`). BSP keeps
//      every part within one step of every other, so the parts behind are
//      inside step C - 1 and reach C when it completes, and none can pass
//      C before all have reached it. A part at the largest clock may still
//      pass it before the cut request arrives (its step completed
//      meanwhile); the retry then cuts at the next clock, waiting for the
//      step under way (offset 1), which an idle job would never finish.
//   2. Every server cuts each range it serves as primary (a synced table's
//      range once all its parts are at C, the others at once), copies it
//      in memory on its data thread and writes it to its data dir (WRITE).
//      A part already past C (the step completed between 1 and 2) makes
//      that server answer kAborted; the attempt is then retried with a new
//      probe and a new id.
//   3. The ranges reported must tile each table's key space exactly (no
//      range moved by a failover meanwhile): only then is the manifest
//      built; the caller writes it.
//
// Thread-safe.
#ifndef DOWNPOUR_SCHEDULER_CHECKPOINTS_H_
#define DOWNPOUR_SCHEDULER_CHECKPOINTS_H_

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "cluster/server_admin_client.h"
#include "common/auth.h"
#include "common/types.h"
#include "proto/downpour.pb.h"

namespace downpour {

// A live server taking part.
struct CheckpointServer {
  NodeId id = kNoNode;
  std::string name;
  std::string admin_address;
};

struct CheckpointPlan {
  uint64_t id = 0;
  std::vector<CheckpointServer> servers;
  std::vector<proto::TableSpec> tables;  // what the manifest must cover
  bool bsp = false;      // probe, and cut synced tables at one clock
  int clock_offset = 0;  // BSP: cut at the largest clock + this
  absl::Time deadline;
  ClusterAuth auth;
};

// gRPC clients of the servers' admin services, kept across checkpoints (a
// new channel costs a connection, which widens the window between the probe
// and the cut). Thread-safe.
class AdminClients {
 public:
  explicit AdminClients(ClusterAuth auth) : auth_(std::move(auth)) {}
  std::shared_ptr<ServerAdminClient> Get(const std::string& address)
      ABSL_LOCKS_EXCLUDED(mu_);

 private:
  const ClusterAuth auth_;
  absl::Mutex mu_;
  std::map<std::string, std::shared_ptr<ServerAdminClient>> clients_
      ABSL_GUARDED_BY(mu_);
};

// Runs one attempt. Returns the manifest's id, clock (C, or -1 when no
// range was cut at a clock), tables, rows and bytes; the caller adds the
// job, the workers' clocks and the times. kAborted when a part had passed
// the cut clock (retry), kFailedPrecondition when the reported ranges do
// not tile a table (retry later) or a server cannot checkpoint (no data
// dir), the servers' own errors otherwise (each naming the server).
absl::StatusOr<proto::CheckpointManifest> RunCheckpoint(
    const CheckpointPlan& plan, AdminClients* clients);

// Tells the servers which checkpoints they may delete (best effort; errors
// are logged).
void DropCheckpoints(const std::vector<CheckpointServer>& servers,
                     const proto::DropCheckpointsRequest& req,
                     AdminClients* clients);

// The ranges of `manifest` held by server `name`.
std::vector<proto::CheckpointRange> RangesOf(
    const proto::CheckpointManifest& manifest, const std::string& name);

// The server names a manifest needs, sorted.
std::vector<std::string> ServersOf(const proto::CheckpointManifest& manifest);

}  // namespace downpour

#endif  // DOWNPOUR_SCHEDULER_CHECKPOINTS_H_
