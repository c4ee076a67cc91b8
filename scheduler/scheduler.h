// ps_scheduler: membership, heartbeats, the versioned cluster map, table
// declaration, named barriers and the workers' clock table, served over gRPC
// (proto::Scheduler).
//
// Every change to membership or tables produces a new map with a larger
// epoch, streamed to watchers. A server or worker silent for `dead_after` is
// marked DEAD. A dead server keeps its key ranges: clients get kUnavailable
// for them until a server registers again under the same name and takes them
// back (data comes back empty until replication lands; see docs). This
// never silently hands a range to a server that lacks its data.
//
// Thread-safe.
#ifndef DOWNPOUR_SCHEDULER_SCHEDULER_H_
#define DOWNPOUR_SCHEDULER_SCHEDULER_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "consistency/consistency.h"
#include "proto/downpour.pb.h"

namespace downpour {

struct SchedulerOptions {
  std::string listen_address = "127.0.0.1:0";  // port 0: pick a free port
  absl::Duration heartbeat_interval = absl::Milliseconds(500);
  absl::Duration dead_after = absl::Seconds(3);
  // CreateTable waits (up to its timeout) until this many servers are alive.
  int min_servers = 1;
  // The job's consistency contract; workers get ranks 0 .. N + b - 1.
  ConsistencyPolicy policy;
  std::string policy_name = "bsp";  // as given to ConsistencyPolicy::Parse
};

class Scheduler {
 public:
  // kUnavailable if the address cannot be bound.
  static absl::StatusOr<std::unique_ptr<Scheduler>> Create(
      const SchedulerOptions& options);
  virtual ~Scheduler() = default;

  virtual int port() const = 0;
  // Blocks until Shutdown().
  virtual void Wait() = 0;
  // Ends watch streams and barrier waits promptly. Idempotent.
  virtual void Shutdown() = 0;
  virtual proto::ClusterMap CurrentMap() const = 0;
};

}  // namespace downpour

#endif  // DOWNPOUR_SCHEDULER_SCHEDULER_H_
