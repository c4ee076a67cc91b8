#include "cluster/server_admin_client.h"

#include <chrono>

#include "absl/strings/str_cat.h"
#include "common/grpc_channel.h"
#include "common/grpc_status.h"
#include "grpcpp/grpcpp.h"

namespace downpour {
namespace {

// Export chunks and their replies are a few MiB.
constexpr int kMaxMessageBytes = 64 << 20;

}  // namespace

ServerAdminClient::ServerAdminClient(const std::string& address,
                                     ClusterAuth auth)
    : address_(address),
      auth_(std::move(auth)),
      stub_(proto::ServerAdmin::NewStub(
          NewGrpcChannel(address, auth_, kMaxMessageBytes))) {}

#define DP_ADMIN_CALL(method, req, reply, what)                            \
  grpc::ClientContext ctx;                                                 \
  ctx.set_deadline(std::chrono::system_clock::now() +                      \
                   absl::ToChronoMilliseconds(timeout));                   \
  grpc::Status s = stub_->method(&ctx, req, &reply);                       \
  if (!s.ok()) {                                                           \
    return FromGrpcStatus(s, absl::StrCat(what, " on server ", address_)); \
  }

absl::StatusOr<proto::ServerStats> ServerAdminClient::GetStats(
    absl::Duration timeout) {
  proto::ServerStats reply;
  DP_ADMIN_CALL(GetStats, proto::StatsRequest(), reply, "get stats");
  return reply;
}

absl::StatusOr<proto::CheckpointPartReply> ServerAdminClient::CheckpointPart(
    const proto::CheckpointPartRequest& req, absl::Duration timeout) {
  proto::CheckpointPartReply reply;
  DP_ADMIN_CALL(CheckpointPart, req, reply,
                absl::StrCat(req.mode() == proto::CheckpointPartRequest::PROBE
                                 ? "probe for checkpoint "
                                 : "checkpoint ",
                             req.checkpoint_id()));
  return reply;
}

absl::Status ServerAdminClient::DropCheckpoints(
    const proto::DropCheckpointsRequest& req, absl::Duration timeout) {
  proto::DropCheckpointsReply reply;
  DP_ADMIN_CALL(DropCheckpoints, req, reply, "drop checkpoints");
  return absl::OkStatus();
}

absl::StatusOr<proto::RestoreReply> ServerAdminClient::Restore(
    const proto::RestoreRequest& req, absl::Duration timeout) {
  proto::RestoreReply reply;
  DP_ADMIN_CALL(Restore, req, reply,
                absl::StrCat("restore checkpoint ", req.checkpoint_id()));
  return reply;
}

absl::StatusOr<proto::ExportRowsReply> ServerAdminClient::ExportRows(
    const proto::ExportRowsRequest& req, absl::Duration timeout) {
  proto::ExportRowsReply reply;
  DP_ADMIN_CALL(ExportRows, req, reply,
                absl::StrCat("export table ", req.table_id(), " keys from ",
                             req.range_begin()));
  return reply;
}

#undef DP_ADMIN_CALL

}  // namespace downpour
