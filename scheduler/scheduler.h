// ps_scheduler: membership, heartbeats, the versioned cluster map, table
// declaration, named barriers and the workers' clock table, served over gRPC
// (proto::Scheduler).
//
//   SchedulerOptions o;  // listen_address "127.0.0.1:0": any free port
//   auto scheduler = Scheduler::Create(o);   // serving when it returns
//   SchedulerClient client((*scheduler)->address());
//   ...
//   (*scheduler)->Shutdown();                // or destroy it
//
// Every change to membership or tables produces a new map with a larger
// epoch, streamed to watchers (WatchClusterMap).
//
// Liveness: SERVER and WORKER nodes heartbeat every heartbeat_interval (told
// to them in RegisterReply); one silent for `dead_after` is marked DEAD by a
// sweep that runs every heartbeat_interval / 2 (one epoch bump per sweep that
// changed anything). CLIENT nodes are never swept. A DEAD node's Heartbeat
// gets kFailedPrecondition; it must Register again under the same name and
// role, and then gets its old id back.
//
// A dead server keeps its key ranges: clients get kUnavailable for them until
// a server registers again under the same name and takes them back (data
// comes back empty until replication lands; see docs). This never silently
// hands a range to a server that lacks its data.
//
// RPC errors (canonical codes): kInvalidArgument for a malformed request
// (no role, a server without data endpoint, a bad table spec, barrier count
// 0); kAlreadyExists for registering a name that is ALIVE or redeclaring a
// table with a different spec; kNotFound for an unknown node id (or an
// unknown update handler); kFailedPrecondition for a heartbeat from a DEAD
// node; kUnavailable when CreateTable finds fewer than min_servers alive
// servers within its timeout, or the scheduler is shutting down;
// kDeadlineExceeded when CreateTable's servers do not all acknowledge the new
// epoch in time (the table stays declared) or a Barrier times out.
//
// Thread-safe.
#ifndef DOWNPOUR_SCHEDULER_SCHEDULER_H_
#define DOWNPOUR_SCHEDULER_SCHEDULER_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "common/auth.h"
#include "consistency/consistency.h"
#include "proto/downpour.pb.h"

namespace downpour {

struct SchedulerOptions {
  std::string listen_address = "127.0.0.1:0";  // port 0: pick a free port
  // Told to nodes at Register.
  absl::Duration heartbeat_interval = absl::Milliseconds(500);
  // A SERVER or WORKER silent this long is marked DEAD.
  absl::Duration dead_after = absl::Seconds(3);
  // CreateTable waits (up to its timeout) until this many servers are alive
  // (at least one in any case).
  int min_servers = 1;
  // The job's consistency contract; workers get ranks 0 .. N + b - 1.
  ConsistencyPolicy policy;
  std::string policy_name = "bsp";  // as given to ConsistencyPolicy::Parse
  // Applied to every call by the gRPC server (common/grpc_server.h): with a
  // secret, calls must carry the cluster token; with TLS, the service is
  // served over TLS (and demands client certificates under mutual TLS). The
  // health service stays open, for probes.
  ClusterAuth auth;
};

class Scheduler {
 public:
  // Starts the gRPC server (with gRPC's default health service) and the
  // liveness sweep. kUnavailable if the address cannot be bound.
  static absl::StatusOr<std::unique_ptr<Scheduler>> Create(
      const SchedulerOptions& options);
  virtual ~Scheduler() = default;  // Shutdown()

  // The bound port.
  virtual int port() const = 0;
  // "127.0.0.1:<port>", for clients on this host.
  std::string address() const { return absl::StrCat("127.0.0.1:", port()); }
  // Blocks until Shutdown() has finished (a daemon's Run).
  virtual void Wait() = 0;
  // Stops the gRPC server; watch streams, waiting barriers and CreateTable
  // calls end promptly (barriers and CreateTable with kUnavailable).
  // Idempotent; a concurrent caller returns once the first has finished.
  virtual void Shutdown() = 0;
  // A copy of the current map.
  virtual proto::ClusterMap CurrentMap() const = 0;
};

}  // namespace downpour

#endif  // DOWNPOUR_SCHEDULER_SCHEDULER_H_
