// A typed client of one server's admin service (proto::ServerAdmin): stats,
// and the checkpoint, restore and export calls the scheduler and tools make.
// Every call has a deadline and returns absl::Status (gRPC errors converted,
// with the server's address as context).
//
// Thread-safe (gRPC stubs are).
#ifndef DOWNPOUR_CLUSTER_SERVER_ADMIN_CLIENT_H_
#define DOWNPOUR_CLUSTER_SERVER_ADMIN_CLIENT_H_

#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/auth.h"
#include "proto/downpour.grpc.pb.h"
#include "proto/downpour.pb.h"

namespace downpour {

class ServerAdminClient {
 public:
  // `address`: host:port of the server's admin service (NodeInfo
  // .admin_address). `auth` (off by default) adds the cluster token.
  explicit ServerAdminClient(const std::string& address,
                             ClusterAuth auth = ClusterAuth());

  const std::string& address() const { return address_; }

  absl::StatusOr<proto::ServerStats> GetStats(absl::Duration timeout);
  absl::StatusOr<proto::CheckpointPartReply> CheckpointPart(
      const proto::CheckpointPartRequest& req, absl::Duration timeout);
  absl::Status DropCheckpoints(const proto::DropCheckpointsRequest& req,
                               absl::Duration timeout);
  absl::StatusOr<proto::RestoreReply> Restore(const proto::RestoreRequest& req,
                                              absl::Duration timeout);
  absl::StatusOr<proto::ExportRowsReply> ExportRows(
      const proto::ExportRowsRequest& req, absl::Duration timeout);

 private:
  const std::string address_;
  const ClusterAuth auth_;
  std::unique_ptr<proto::ServerAdmin::Stub> stub_;
};

}  // namespace downpour

#endif  // DOWNPOUR_CLUSTER_SERVER_ADMIN_CLIENT_H_
