#include "cluster/scheduler_client.h"

#include <algorithm>
#include <chrono>

#include "absl/strings/str_cat.h"
#include "common/grpc_channel.h"
#include "common/grpc_status.h"
#include "grpcpp/grpcpp.h"

namespace downpour {

void SchedulerClient::Prepare(grpc::ClientContext* ctx,
                              absl::Duration timeout) const {
  ctx->set_deadline(std::chrono::system_clock::now() +
                    absl::ToChronoMilliseconds(timeout));
}

SchedulerClient::SchedulerClient(const std::string& address,
                                 absl::Duration rpc_timeout, ClusterAuth auth)
    : address_(address),
      rpc_timeout_(rpc_timeout),
      stub_(proto::Scheduler::NewStub(NewGrpcChannel(address, auth))) {}

SchedulerClient::~SchedulerClient() { CancelWatch(); }

absl::StatusOr<proto::RegisterReply> SchedulerClient::Register(
    const proto::RegisterRequest& request, absl::Duration wait) {
  const absl::Time deadline = absl::Now() + wait;
  while (true) {
    grpc::ClientContext ctx;
    Prepare(&ctx, std::min(rpc_timeout_, std::max(deadline - absl::Now(),
                                                  absl::Milliseconds(100))));
    ctx.set_wait_for_ready(true);  // the scheduler may still be starting
    proto::RegisterReply reply;
    grpc::Status s = stub_->Register(&ctx, request, &reply);
    if (s.ok()) return reply;
    const bool retry = s.error_code() == grpc::StatusCode::UNAVAILABLE ||
                       s.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED;
    if (!retry || absl::Now() >= deadline) {
      return FromGrpcStatus(
          s, absl::StrCat("register with scheduler at ", address_));
    }
    absl::SleepFor(absl::Milliseconds(100));
  }
}

absl::StatusOr<proto::HeartbeatReply> SchedulerClient::Heartbeat(
    NodeId id, Epoch applied_epoch) {
  proto::HeartbeatRequest req;
  req.set_node_id(id);
  req.set_applied_epoch(applied_epoch);
  return Heartbeat(req);
}

absl::StatusOr<proto::HeartbeatReply> SchedulerClient::Heartbeat(
    const proto::HeartbeatRequest& req) {
  grpc::ClientContext ctx;
  Prepare(&ctx, rpc_timeout_);
  proto::HeartbeatReply reply;
  grpc::Status s = stub_->Heartbeat(&ctx, req, &reply);
  if (!s.ok())
    return FromGrpcStatus(s, absl::StrCat("heartbeat to ", address_));
  return reply;
}

absl::Status SchedulerClient::Leave(NodeId id, bool finished,
                                    const std::string& reason, bool retire) {
  grpc::ClientContext ctx;
  Prepare(&ctx, rpc_timeout_);
  proto::LeaveRequest req;
  req.set_node_id(id);
  req.set_finished(finished);
  req.set_reason(reason);
  req.set_retire(retire);
  proto::LeaveReply reply;
  return FromGrpcStatus(stub_->Leave(&ctx, req, &reply),
                        absl::StrCat("leave the job at ", address_));
}

absl::StatusOr<proto::DrainReply> SchedulerClient::Drain(
    const proto::DrainRequest& req) {
  grpc::ClientContext ctx;
  Prepare(&ctx, rpc_timeout_);
  proto::DrainReply reply;
  grpc::Status s = stub_->Drain(&ctx, req, &reply);
  if (!s.ok()) {
    return FromGrpcStatus(
        s,
        absl::StrCat("drain ",
                     req.name().empty() ? absl::StrCat("node ", req.node_id())
                                        : "server '" + req.name() + "'",
                     " at ", address_));
  }
  return reply;
}

absl::StatusOr<proto::SplitRangeReply> SchedulerClient::SplitRange(
    const proto::SplitRangeRequest& req) {
  grpc::ClientContext ctx;
  Prepare(&ctx, rpc_timeout_);
  proto::SplitRangeReply reply;
  grpc::Status s = stub_->SplitRange(&ctx, req, &reply);
  if (!s.ok()) {
    return FromGrpcStatus(
        s, absl::StrCat("split table '", req.table(), "' at key ", req.key(),
                        " at ", address_));
  }
  return reply;
}

absl::StatusOr<proto::RetireWorkerReply> SchedulerClient::RetireWorker(
    int rank) {
  grpc::ClientContext ctx;
  Prepare(&ctx, rpc_timeout_);
  proto::RetireWorkerRequest req;
  req.set_rank(rank);
  proto::RetireWorkerReply reply;
  grpc::Status s = stub_->RetireWorker(&ctx, req, &reply);
  if (!s.ok()) {
    return FromGrpcStatus(
        s, absl::StrCat("retire worker of rank ", rank, " at ", address_));
  }
  return reply;
}

absl::StatusOr<proto::ClusterMap> SchedulerClient::GetClusterMap() {
  grpc::ClientContext ctx;
  Prepare(&ctx, rpc_timeout_);
  proto::ClusterMap map;
  grpc::Status s =
      stub_->GetClusterMap(&ctx, proto::GetClusterMapRequest(), &map);
  if (!s.ok()) {
    return FromGrpcStatus(s, absl::StrCat("get cluster map from ", address_));
  }
  return map;
}

absl::StatusOr<proto::CreateTableReply> SchedulerClient::CreateTable(
    const proto::TableSpec& spec, absl::Duration timeout) {
  timeout = std::min(timeout, kMaxSchedulerWait);
  grpc::ClientContext ctx;
  Prepare(&ctx, timeout + absl::Seconds(5));
  proto::CreateTableRequest req;
  *req.mutable_spec() = spec;
  req.set_timeout_ms(absl::ToInt64Milliseconds(timeout));
  proto::CreateTableReply reply;
  grpc::Status s = stub_->CreateTable(&ctx, req, &reply);
  if (!s.ok()) {
    return FromGrpcStatus(s, absl::StrCat("create table '", spec.name(), "'"));
  }
  return reply;
}

absl::Status SchedulerClient::AckEpoch(
    NodeId id, Epoch epoch, const std::vector<proto::TableFailure>& failed) {
  grpc::ClientContext ctx;
  Prepare(&ctx, rpc_timeout_);
  proto::AckEpochRequest req;
  req.set_node_id(id);
  req.set_epoch(epoch);
  for (const proto::TableFailure& f : failed) *req.add_failed_tables() = f;
  proto::AckEpochReply reply;
  return FromGrpcStatus(stub_->AckEpoch(&ctx, req, &reply),
                        absl::StrCat("ack epoch ", epoch));
}

namespace {

const absl::Status& StatusOf(const absl::Status& s) { return s; }
template <typename T>
const absl::Status& StatusOf(const absl::StatusOr<T>& s) {
  return s.status();
}

// `call(slice)` until it succeeds, fails otherwise than by its deadline, or
// `timeout` has passed, each slice at most kMaxSchedulerWait.
template <typename Call>
auto InSlices(absl::Duration timeout, Call call) -> decltype(call(timeout)) {
  const absl::Time deadline = absl::Now() + timeout;
  for (;;) {
    const absl::Duration left =
        std::max(absl::ZeroDuration(), deadline - absl::Now());
    auto result = call(std::min(left, kMaxSchedulerWait));
    if (left <= kMaxSchedulerWait ||
        !absl::IsDeadlineExceeded(StatusOf(result))) {
      return result;
    }
  }
}

}  // namespace

absl::Status SchedulerClient::Barrier(const std::string& name, NodeId id,
                                      uint32_t count, absl::Duration timeout) {
  return InSlices(timeout, [&](absl::Duration slice) {
    return BarrierCall(name, id, count, slice);
  });
}

absl::Status SchedulerClient::BarrierCall(const std::string& name, NodeId id,
                                          uint32_t count,
                                          absl::Duration timeout) {
  grpc::ClientContext ctx;
  Prepare(&ctx, timeout + absl::Seconds(5));
  proto::BarrierRequest req;
  req.set_name(name);
  req.set_node_id(id);
  req.set_count(count);
  req.set_timeout_ms(absl::ToInt64Milliseconds(timeout));
  proto::BarrierReply reply;
  return FromGrpcStatus(stub_->Barrier(&ctx, req, &reply),
                        absl::StrCat("barrier '", name, "'"));
}

absl::StatusOr<proto::AdvanceClockReply> SchedulerClient::AdvanceClock(
    const proto::AdvanceClockRequest& req) {
  grpc::ClientContext ctx;
  Prepare(&ctx, rpc_timeout_);
  proto::AdvanceClockReply reply;
  grpc::Status s = stub_->AdvanceClock(&ctx, req, &reply);
  if (!s.ok()) {
    return FromGrpcStatus(s, absl::StrCat("advance clock of worker ",
                                          req.rank(), " to ", req.clock()));
  }
  return reply;
}

absl::StatusOr<int64_t> SchedulerClient::WaitClock(NodeId id, int rank,
                                                   int64_t clock,
                                                   absl::Duration timeout,
                                                   TableId table) {
  return InSlices(timeout, [&](absl::Duration slice) {
    return WaitClockCall(id, rank, clock, slice, table);
  });
}

absl::StatusOr<int64_t> SchedulerClient::WaitClockCall(NodeId id, int rank,
                                                       int64_t clock,
                                                       absl::Duration timeout,
                                                       TableId table) {
  grpc::ClientContext ctx;
  Prepare(&ctx, timeout + absl::Seconds(5));
  proto::WaitClockRequest req;
  req.set_node_id(id);
  req.set_rank(rank);
  req.set_clock(clock);
  req.set_timeout_ms(absl::ToInt64Milliseconds(timeout));
  req.set_table_id(table);
  proto::WaitClockReply reply;
  grpc::Status s = stub_->WaitClock(&ctx, req, &reply);
  if (!s.ok()) return FromGrpcStatus(s, "wait clock");
  return reply.gating_clock();
}

absl::StatusOr<std::vector<int>> SchedulerClient::EpochSplit(NodeId id,
                                                             int rank,
                                                             int64_t epoch) {
  grpc::ClientContext ctx;
  Prepare(&ctx, rpc_timeout_);
  proto::EpochSplitRequest req;
  req.set_node_id(id);
  req.set_rank(rank);
  req.set_epoch(epoch);
  proto::EpochSplitReply reply;
  grpc::Status s = stub_->EpochSplit(&ctx, req, &reply);
  if (!s.ok())
    return FromGrpcStatus(s, absl::StrCat("epoch split at ", address_));
  return std::vector<int>(reply.ranks().begin(), reply.ranks().end());
}

absl::StatusOr<proto::JobStatus> SchedulerClient::GetJobStatus() {
  grpc::ClientContext ctx;
  Prepare(&ctx, rpc_timeout_);
  proto::JobStatus status;
  grpc::Status s =
      stub_->GetJobStatus(&ctx, proto::JobStatusRequest(), &status);
  if (!s.ok()) return FromGrpcStatus(s, "get job status");
  return status;
}

absl::Status SchedulerClient::Watch(
    NodeId id, Epoch known_epoch,
    const std::function<void(const proto::ClusterMap&)>& on_map) {
  grpc::ClientContext ctx;
  {
    absl::MutexLock lock(&mu_);
    if (cancelled_) return absl::OkStatus();
    watch_context_ = &ctx;
  }
  proto::WatchClusterMapRequest req;
  req.set_node_id(id);
  req.set_known_epoch(known_epoch);
  auto reader = stub_->WatchClusterMap(&ctx, req);
  proto::ClusterMap map;
  while (reader->Read(&map)) on_map(map);
  grpc::Status s = reader->Finish();
  absl::MutexLock lock(&mu_);
  watch_context_ = nullptr;
  if (cancelled_) return absl::OkStatus();
  return FromGrpcStatus(
      s.ok() ? grpc::Status(grpc::StatusCode::UNAVAILABLE, "stream ended") : s,
      absl::StrCat("watch cluster map at ", address_));
}

void SchedulerClient::CancelWatch() {
  absl::MutexLock lock(&mu_);
  cancelled_ = true;
  if (watch_context_ != nullptr) watch_context_->TryCancel();
}

absl::Status SchedulerClient::ReplicaReady(
    const proto::ReplicaReadyRequest& req) {
  grpc::ClientContext ctx;
  Prepare(&ctx, rpc_timeout_);
  proto::ReplicaReadyReply reply;
  grpc::Status s = stub_->ReplicaReady(&ctx, req, &reply);
  if (!s.ok()) {
    return FromGrpcStatus(s,
                          absl::StrCat("report replica ready to ", address_));
  }
  return absl::OkStatus();
}

absl::Status SchedulerClient::ReportUnreachable(NodeId reporter, NodeId suspect,
                                                const std::string& reason) {
  grpc::ClientContext ctx;
  Prepare(&ctx, rpc_timeout_);
  proto::ReportUnreachableRequest req;
  req.set_reporter(reporter);
  req.set_suspect(suspect);
  req.set_reason(reason);
  proto::ReportUnreachableReply reply;
  grpc::Status s = stub_->ReportUnreachable(&ctx, req, &reply);
  if (!s.ok()) {
    return FromGrpcStatus(
        s, absl::StrCat("report node ", suspect, " unreachable to ", address_));
  }
  return absl::OkStatus();
}

absl::StatusOr<proto::CheckpointManifest> SchedulerClient::Checkpoint(
    absl::Duration timeout, const proto::LbfgsState& lbfgs) {
  grpc::ClientContext ctx;
  Prepare(&ctx, timeout + absl::Seconds(5));
  proto::CheckpointRequest req;
  req.set_timeout_ms(absl::ToInt64Milliseconds(timeout));
  *req.mutable_lbfgs() = lbfgs;
  proto::CheckpointReply reply;
  grpc::Status s = stub_->Checkpoint(&ctx, req, &reply);
  if (!s.ok()) return FromGrpcStatus(s, "checkpoint");
  return reply.manifest();
}

absl::StatusOr<std::vector<proto::CheckpointManifest>>
SchedulerClient::ListCheckpoints() {
  grpc::ClientContext ctx;
  Prepare(&ctx, rpc_timeout_);
  proto::ListCheckpointsReply reply;
  grpc::Status s =
      stub_->ListCheckpoints(&ctx, proto::ListCheckpointsRequest(), &reply);
  if (!s.ok()) return FromGrpcStatus(s, "list checkpoints");
  return std::vector<proto::CheckpointManifest>(reply.checkpoints().begin(),
                                                reply.checkpoints().end());
}

absl::StatusOr<proto::RestoreCheckpointReply>
SchedulerClient::RestoreCheckpoint(uint64_t id, absl::Duration timeout) {
  grpc::ClientContext ctx;
  Prepare(&ctx, timeout + absl::Seconds(5));
  proto::RestoreCheckpointRequest req;
  req.set_checkpoint_id(id);
  req.set_timeout_ms(absl::ToInt64Milliseconds(timeout));
  proto::RestoreCheckpointReply reply;
  grpc::Status s = stub_->RestoreCheckpoint(&ctx, req, &reply);
  if (!s.ok()) return FromGrpcStatus(s, "restore checkpoint");
  return reply;
}

}  // namespace downpour
