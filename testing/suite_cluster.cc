#include "testing/suite_cluster.h"

#include <utility>

#include "cluster/scheduler_client.h"
#include "cluster/server_admin_client.h"
#include "common/status_macros.h"
#include "common/test_util.h"
#include "google/protobuf/descriptor.h"
#include "google/protobuf/message.h"

namespace downpour {

LocalClusterOptions SuiteCluster::Defaults() {
  LocalClusterOptions o;
  o.bin_dir = RunfilePath("");
  o.work_dir = TestTmpDir();
  o.num_servers = 2;
  return o;
}

absl::Status SuiteCluster::Start(const LocalClusterOptions& options,
                                 bool connect_client,
                                 absl::Duration op_timeout) {
  if (cluster_ != nullptr) {
    return absl::FailedPreconditionError("suite cluster already started");
  }
  DP_ASSIGN_OR_RETURN(auth_, ClusterAuth::Load(options.cluster_secret_file,
                                               options.tls, kGrpcClient));
  DP_ASSIGN_OR_RETURN(cluster_, LocalCluster::Start(options));
  if (connect_client) {
    ClientOptions co;
    co.scheduler_address = cluster_->scheduler_address();
    co.op_timeout = op_timeout;
    co.auth = auth_;
    DP_ASSIGN_OR_RETURN(client_, Client::Connect(co));
  }
  return absl::OkStatus();
}

absl::Status SuiteCluster::Stop() {
  client_.reset();
  if (cluster_ == nullptr) return absl::OkStatus();
  absl::Status s = cluster_->Stop();
  cluster_.reset();
  return s;
}

absl::StatusOr<proto::ClusterMap> SuiteCluster::Map() const {
  SchedulerClient sched(cluster_->scheduler_address(), absl::Seconds(10),
                        auth_);
  return sched.GetClusterMap();
}

absl::StatusOr<std::vector<proto::ServerStats>> SuiteCluster::ServerStats()
    const {
  DP_ASSIGN_OR_RETURN(proto::ClusterMap map, Map());
  std::vector<proto::ServerStats> all;
  for (const auto& n : map.nodes()) {
    if (n.role() != proto::SERVER || n.state() != proto::ALIVE) continue;
    ServerAdminClient admin(n.admin_address(), auth_);
    DP_ASSIGN_OR_RETURN(proto::ServerStats stats,
                        admin.GetStats(absl::Seconds(10)), "stats of server ",
                        n.name());
    all.push_back(std::move(stats));
  }
  return all;
}

absl::StatusOr<proto::TableStats> SuiteCluster::TableStats(
    const std::string& name) const {
  DP_ASSIGN_OR_RETURN(std::vector<proto::ServerStats> all, ServerStats());
  // Every integer field is summed over the servers (rows, bytes, counters),
  // but for the largest staleness, which is a maximum; so a figure added
  // to TableStats is summed here without a change.
  proto::TableStats sum;
  sum.set_name(name);
  const auto* desc = proto::TableStats::descriptor();
  const auto* refl = proto::TableStats::GetReflection();
  using FD = google::protobuf::FieldDescriptor;
  for (const auto& server : all) {
    for (const auto& t : server.tables()) {
      if (t.name() != name) continue;
      sum.set_id(t.id());
      for (int i = 0; i < desc->field_count(); ++i) {
        const FD* f = desc->field(i);
        if (f->is_repeated() || f->name() == "id") continue;
        const bool max = f->name() == "max_staleness";
        switch (f->cpp_type()) {
          case FD::CPPTYPE_UINT64: {
            const uint64_t a = refl->GetUInt64(sum, f);
            const uint64_t b = refl->GetUInt64(t, f);
            refl->SetUInt64(&sum, f, max ? std::max(a, b) : a + b);
            break;
          }
          case FD::CPPTYPE_INT64: {
            const int64_t a = refl->GetInt64(sum, f);
            const int64_t b = refl->GetInt64(t, f);
            refl->SetInt64(&sum, f, max ? std::max(a, b) : a + b);
            break;
          }
          default:
            break;
        }
      }
    }
  }
  return sum;
}

}  // namespace downpour
