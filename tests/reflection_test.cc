// gRPC server reflection on the daemons, called as grpcurl calls it: list
// the services, then fetch the descriptor of one to learn its methods.
#include <memory>
#include <set>
#include <string>

#include "absl/time/clock.h"
#include "cluster/scheduler_client.h"
#include "common/test_util.h"
#include "google/protobuf/descriptor.pb.h"
#include "grpc/reflection/v1alpha/reflection.grpc.pb.h"
#include "grpcpp/grpcpp.h"
#include "launch/local_cluster.h"

namespace downpour {
namespace {

namespace refl = grpc::reflection::v1alpha;

// One request on a reflection stream, its one response.
absl::StatusOr<refl::ServerReflectionResponse> Ask(
    const std::string& address, const refl::ServerReflectionRequest& req) {
  auto stub = refl::ServerReflection::NewStub(
      grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
  auto stream = stub->ServerReflectionInfo(&ctx);
  refl::ServerReflectionResponse resp;
  if (!stream->Write(req) || !stream->WritesDone() || !stream->Read(&resp)) {
    return absl::UnavailableError("no reflection answer from " + address);
  }
  refl::ServerReflectionResponse extra;
  while (stream->Read(&extra)) {
  }
  (void)stream->Finish();
  return resp;
}

std::set<std::string> ListServices(const std::string& address) {
  refl::ServerReflectionRequest req;
  req.set_list_services("");
  auto resp = Ask(address, req);
  EXPECT_OK(resp);
  std::set<std::string> out;
  if (resp.ok()) {
    for (const auto& s : resp->list_services_response().service())
      out.insert(s.name());
  }
  return out;
}

TEST(ReflectionTest, DaemonsListTheirServicesAndDescribeThem) {
  LocalClusterOptions o;
  o.bin_dir = RunfilePath("");
  o.work_dir = TestTmpDir();
  o.num_servers = 1;
  ASSERT_OK_AND_ASSIGN(auto cluster, LocalCluster::Start(o));

  const std::set<std::string> scheduler =
      ListServices(cluster->scheduler_address());
  EXPECT_EQ(scheduler.count("downpour.proto.Scheduler"), 1u);
  EXPECT_EQ(scheduler.count("grpc.health.v1.Health"), 1u);
  EXPECT_EQ(scheduler.count("grpc.reflection.v1alpha.ServerReflection"), 1u);
  EXPECT_EQ(scheduler.count("downpour.proto.ServerAdmin"), 0u);

  SchedulerClient sched(cluster->scheduler_address());
  ASSERT_OK_AND_ASSIGN(proto::ClusterMap map, sched.GetClusterMap());
  ASSERT_EQ(map.nodes_size(), 1);
  const std::set<std::string> server =
      ListServices(map.nodes(0).admin_address());
  EXPECT_EQ(server.count("downpour.proto.ServerAdmin"), 1u);
  EXPECT_EQ(server.count("grpc.health.v1.Health"), 1u);
  EXPECT_EQ(server.count("downpour.proto.Scheduler"), 0u);

  // What `grpcurl describe downpour.proto.Scheduler` asks.
  refl::ServerReflectionRequest req;
  req.set_file_containing_symbol("downpour.proto.Scheduler");
  ASSERT_OK_AND_ASSIGN(refl::ServerReflectionResponse resp,
                       Ask(cluster->scheduler_address(), req));
  ASSERT_GT(resp.file_descriptor_response().file_descriptor_proto_size(), 0)
      << resp.DebugString();
  bool found = false;
  for (const std::string& bytes :
       resp.file_descriptor_response().file_descriptor_proto()) {
    google::protobuf::FileDescriptorProto file;
    ASSERT_TRUE(file.ParseFromString(bytes));
    for (const auto& service : file.service()) {
      if (service.name() != "Scheduler") continue;
      for (const auto& method : service.method()) {
        found = found || (method.name() == "GetJobStatus" &&
                          method.output_type() == ".downpour.proto.JobStatus");
      }
    }
  }
  EXPECT_TRUE(found) << "no Scheduler.GetJobStatus in the descriptors";

  // An unknown symbol is NOT_FOUND in the answer.
  req.set_file_containing_symbol("downpour.proto.NoSuchService");
  ASSERT_OK_AND_ASSIGN(resp, Ask(cluster->scheduler_address(), req));
  EXPECT_EQ(resp.error_response().error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_OK(cluster->Stop());
}

}  // namespace
}  // namespace downpour
