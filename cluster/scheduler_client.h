// A typed client of the scheduler's gRPC service, shared by servers, workers
// and the client SDK. Every call has a deadline and returns absl::Status
// (gRPC errors converted, with the scheduler's address as context).
//
// Thread-safe (gRPC stubs are).
#ifndef DOWNPOUR_CLUSTER_SCHEDULER_CLIENT_H_
#define DOWNPOUR_CLUSTER_SCHEDULER_CLIENT_H_

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/auth.h"
#include "common/types.h"
#include "proto/downpour.grpc.pb.h"
#include "proto/downpour.pb.h"

namespace grpc {
class ClientContext;
}

namespace downpour {

// The longest the scheduler holds one call open: it refuses a longer wait
// (scheduler/request_checks.h), so that no peer pins its threads. Barrier
// and WaitClock wait longer as several calls; CreateTable waits at most
// this long.
inline constexpr absl::Duration kMaxSchedulerWait = absl::Minutes(10);

class SchedulerClient {
 public:
  // `auth` (off by default): the cluster token on every call, TLS
  // (common/grpc_channel.h).
  explicit SchedulerClient(const std::string& address,
                           absl::Duration rpc_timeout = absl::Seconds(10),
                           ClusterAuth auth = ClusterAuth());
  ~SchedulerClient();  // cancels a running Watch

  const std::string& address() const { return address_; }

  // Retries kUnavailable (scheduler not up yet) until `wait`.
  absl::StatusOr<proto::RegisterReply> Register(
      const proto::RegisterRequest& request, absl::Duration wait);
  absl::StatusOr<proto::HeartbeatReply> Heartbeat(NodeId id,
                                                  Epoch applied_epoch);
  // A server's heartbeat with its ranges' figures.
  absl::StatusOr<proto::HeartbeatReply> Heartbeat(
      const proto::HeartbeatRequest& req);
  // A worker leaves the job at once (LEFT); `finished`: after its last
  // step, else its rank waits for a replacement. A drained server leaves
  // the cluster (kFailedPrecondition while it holds ranges).
  // `retire`: for good (LeaveRequest.retire).
  absl::Status Leave(NodeId id, bool finished, const std::string& reason,
                     bool retire = false);
  // Drains a server or calls its drain off (proto::DrainRequest).
  absl::StatusOr<proto::DrainReply> Drain(const proto::DrainRequest& req);
  // Starts a split of a table's range (proto::SplitRangeRequest).
  absl::StatusOr<proto::SplitRangeReply> SplitRange(
      const proto::SplitRangeRequest& req);
  // Removes a worker's rank from an ASP or SSP job for good
  // (proto::RetireWorkerRequest).
  absl::StatusOr<proto::RetireWorkerReply> RetireWorker(int rank);
  absl::StatusOr<proto::ClusterMap> GetClusterMap();
  absl::StatusOr<proto::CreateTableReply> CreateTable(
      const proto::TableSpec& spec, absl::Duration timeout);
  // `failed`: tables of that epoch's map this server cannot create or
  // hold.
  absl::Status AckEpoch(NodeId id, Epoch epoch,
                        const std::vector<proto::TableFailure>& failed = {});
  // Any timeout: a wait longer than kMaxSchedulerWait arrives again after
  // each kMaxSchedulerWait (the scheduler counts a member that timed out as
  // gone, so the barrier is only passed with every member there).
  absl::Status Barrier(const std::string& name, NodeId id, uint32_t count,
                       absl::Duration timeout);

  // Worker clocks (see consistency/consistency.h).
  // Records the worker's clock; the reply carries the gating clock and the
  // smallest clock of the other workers.
  absl::StatusOr<proto::AdvanceClockReply> AdvanceClock(
      const proto::AdvanceClockRequest& req);
  // Blocks until a worker at `clock` may proceed; returns the gating clock.
  // `id` is the calling worker's node id, which must hold `rank`.
  // `table` (kNoTable: the job's policy): wait as that table's own policy
  // bounds it (WaitClockRequest.table_id).
  absl::StatusOr<int64_t> WaitClock(NodeId id, int rank, int64_t clock,
                                    absl::Duration timeout,
                                    TableId table = kNoTable);
  absl::StatusOr<proto::JobStatus> GetJobStatus();
  // The ranks epoch `epoch` is split over (EpochSplitRequest).
  absl::StatusOr<std::vector<int>> EpochSplit(NodeId id, int rank,
                                              int64_t epoch);

  // Replication (see server/internal/replicator.h).
  absl::Status ReplicaReady(const proto::ReplicaReadyRequest& req);
  absl::Status ReportUnreachable(NodeId reporter, NodeId suspect,
                                 const std::string& reason);

  // Checkpoints (see scheduler.h): takes one and waits up to `timeout`.
  // `lbfgs`: a Sandblaster coordinator's state, recorded in the manifest.
  absl::StatusOr<proto::CheckpointManifest> Checkpoint(
      absl::Duration timeout, const proto::LbfgsState& lbfgs = {});
  absl::StatusOr<std::vector<proto::CheckpointManifest>> ListCheckpoints();
  // Rolls the job back to checkpoint `id` and waits up to `timeout` for it.
  absl::StatusOr<proto::RestoreCheckpointReply> RestoreCheckpoint(
      uint64_t id, absl::Duration timeout);

  // Streams cluster maps newer than `known_epoch` to `on_map` until Cancel()
  // or the stream breaks; returns why it ended (OK after Cancel()).
  // Blocks; run it on its own thread. One Watch at a time.
  absl::Status Watch(
      NodeId id, Epoch known_epoch,
      const std::function<void(const proto::ClusterMap&)>& on_map)
      ABSL_LOCKS_EXCLUDED(mu_);
  void CancelWatch() ABSL_LOCKS_EXCLUDED(mu_);

 private:
  // The deadline of one call.
  void Prepare(grpc::ClientContext* ctx, absl::Duration timeout) const;
  // One call of each wait, `timeout` at most kMaxSchedulerWait.
  absl::Status BarrierCall(const std::string& name, NodeId id, uint32_t count,
                           absl::Duration timeout);
  absl::StatusOr<int64_t> WaitClockCall(NodeId id, int rank, int64_t clock,
                                        absl::Duration timeout, TableId table);

  const std::string address_;
  const absl::Duration rpc_timeout_;
  std::unique_ptr<proto::Scheduler::Stub> stub_;
  absl::Mutex mu_;
  grpc::ClientContext* watch_context_ ABSL_GUARDED_BY(mu_) = nullptr;
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace downpour

#endif  // DOWNPOUR_CLUSTER_SCHEDULER_CLIENT_H_
