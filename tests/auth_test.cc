// Cluster authentication over the real daemons: a scheduler and two servers
// started with --cluster_secret_file serve a client holding the secret, and
// refuse, with a clear error and without any change of state, a client
// without it, one with another secret, a raw data-plane peer, unauthenticated
// admin calls and a worker daemon given the wrong secret.
#include "common/auth.h"

#include <sys/wait.h>

#include <fstream>
#include <string>
#include <vector>

#include "absl/synchronization/notification.h"
#include "client/client.h"
#include "cluster/scheduler_client.h"
#include "common/buffer_pool.h"
#include "common/grpc_channel.h"
#include "common/subprocess.h"
#include "common/test_util.h"
#include "grpcpp/grpcpp.h"
#include "launch/local_cluster.h"
#include "proto/downpour.grpc.pb.h"
#include "proto/health.grpc.pb.h"
#include "testing/suite_cluster.h"
#include "transport/data_client.h"

namespace downpour {
namespace {

std::string WriteSecret(const std::string& path) {
  auto secret = ClusterAuth::NewSecret();
  EXPECT_OK(secret);
  std::ofstream(path) << *secret << "\n";
  return path;
}

class AuthTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    const std::string dir = TestTmpDir() + "/auth";
    ASSERT_EQ(system(("mkdir -p " + dir).c_str()), 0);
    secret_file_ = new std::string(WriteSecret(dir + "/cluster.secret"));
    LocalClusterOptions o = SuiteCluster::Defaults();
    o.work_dir = dir;
    o.cluster_secret_file = *secret_file_;
    // Clients of their own: each test picks its credentials.
    ASSERT_OK(suite_.Start(o, /*connect_client=*/false));
  }
  static void TearDownTestSuite() {
    EXPECT_OK(suite_.Stop());
    delete secret_file_;
  }

  static ClusterAuth Auth() {
    auto auth = ClusterAuth::FromFile(*secret_file_);
    EXPECT_OK(auth);
    return *auth;
  }
  static ClientOptions Options(ClusterAuth auth) {
    ClientOptions co;
    co.scheduler_address = suite_.cluster().scheduler_address();
    co.op_timeout = absl::Seconds(10);
    co.connect_timeout = absl::Seconds(5);
    co.auth = std::move(auth);
    return co;
  }
  static proto::ClusterMap Map() {
    SchedulerClient sched(suite_.cluster().scheduler_address(),
                          absl::Seconds(10), Auth());
    auto map = sched.GetClusterMap();
    EXPECT_OK(map);
    return *map;
  }
  // A server's stats, asked with `auth` (off: no token).
  static grpc::Status GetStats(const std::string& admin_address,
                               const ClusterAuth& auth,
                               proto::ServerStats* stats) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() +
                     std::chrono::seconds(5));
    return proto::ServerAdmin::NewStub(NewGrpcChannel(admin_address, auth))
        ->GetStats(&ctx, proto::StatsRequest(), stats);
  }
  static uint64_t AuthFailures() {
    uint64_t total = 0;
    const proto::ClusterMap map = Map();
    for (const auto& n : map.nodes()) {
      if (n.role() != proto::SERVER) continue;
      proto::ServerStats stats;
      grpc::Status s = GetStats(n.admin_address(), Auth(), &stats);
      EXPECT_TRUE(s.ok()) << s.error_message();
      total += stats.auth_failures();
    }
    return total;
  }

  static std::string* secret_file_;
  static SuiteCluster suite_;
};
std::string* AuthTest::secret_file_ = nullptr;
SuiteCluster AuthTest::suite_;

TEST_F(AuthTest, ClientWithTheSecretWorks) {
  ASSERT_OK_AND_ASSIGN(auto client, Client::Connect(Options(Auth())));
  TableOptions t;
  t.name = "auth_ok";
  t.width = 2;
  t.num_keys = 100;
  t.handler = "sgd";
  t.handler_params = {{"learning_rate", 0.5}};
  ASSERT_OK_AND_ASSIGN(Table table, client->CreateTable(t));
  std::vector<Key> keys = {0, 99, 50};
  std::vector<float> values = {1, 2, 3, 4, 5, 6};
  ASSERT_OK(client->PutSync(table, keys, values));
  std::vector<float> grads(6, 2.0f);
  ASSERT_OK(client->PushSync(table, keys, grads));
  std::vector<float> out(6);
  ASSERT_OK(client->Wait(client->Pull(table, keys, absl::MakeSpan(out))));
  EXPECT_EQ(out, (std::vector<float>{0, 1, 2, 3, 4, 5}));
}

TEST_F(AuthTest, ClientWithoutOrWithAnotherSecretIsRefused) {
  auto none = Client::Connect(Options(ClusterAuth()));
  EXPECT_THAT(none.status(), StatusIs(absl::StatusCode::kUnauthenticated));
  EXPECT_THAT(std::string(none.status().message()),
              ::testing::HasSubstr("token"));

  ASSERT_OK_AND_ASSIGN(std::string other, ClusterAuth::NewSecret());
  ASSERT_OK_AND_ASSIGN(ClusterAuth wrong, ClusterAuth::FromSecret(other));
  auto bad = Client::Connect(Options(wrong));
  EXPECT_THAT(bad.status(), StatusIs(absl::StatusCode::kUnauthenticated));
}

// A peer that skips the scheduler and talks to a server's data endpoint
// directly: its request never reaches the tables.
TEST_F(AuthTest, RawDataPlanePeerIsRefusedAndChangesNothing) {
  ASSERT_OK_AND_ASSIGN(auto client, Client::Connect(Options(Auth())));
  TableOptions t;
  t.name = "auth_raw";
  t.width = 1;
  t.num_keys = 10;
  t.handler = "assign";
  ASSERT_OK_AND_ASSIGN(Table table, client->CreateTable(t));
  std::vector<Key> keys(10);
  for (Key k = 0; k < 10; ++k) keys[k] = k;
  std::vector<float> before(10, 7.0f);
  ASSERT_OK(client->PutSync(table, keys, before));
  const uint64_t failures_before = AuthFailures();

  BufferPool pool;
  for (const bool with_wrong_secret : {false, true}) {
    DataClientOptions dopts;
    if (with_wrong_secret) {
      ASSERT_OK_AND_ASSIGN(std::string other, ClusterAuth::NewSecret());
      ASSERT_OK_AND_ASSIGN(dopts.auth, ClusterAuth::FromSecret(other));
    }
    ASSERT_OK_AND_ASSIGN(auto raw, DataClient::Create(dopts, &pool));
    const proto::ClusterMap map = Map();
    for (const auto& n : map.nodes()) {
      if (n.role() != proto::SERVER) continue;
      std::vector<float> evil(10, -1.0f);
      OutgoingRequest req;
      req.header.set_op(proto::PUT);
      req.header.set_table_id(table.id);
      req.header.set_is_range(true);
      req.header.set_range_begin(0);
      req.header.set_range_end(10);
      req.header.set_width(1);
      req.header.set_epoch(map.epoch());
      req.values = Payload::Borrow(evil.data(), evil.size() * sizeof(float));
      absl::Notification done;
      absl::Status status;
      raw->Send(n.data_endpoint(), std::move(req),
                absl::Now() + absl::Seconds(15),
                [&](const absl::Status& s, const IncomingMessage*) {
                  status = s;
                  done.Notify();
                });
      ASSERT_TRUE(done.WaitForNotificationWithTimeout(absl::Seconds(30)));
      EXPECT_THAT(status, StatusIs(absl::StatusCode::kUnauthenticated))
          << n.data_endpoint();
      EXPECT_THAT(std::string(status.message()),
                  ::testing::HasSubstr(n.data_endpoint()));
    }
  }
  std::vector<float> after(10);
  ASSERT_OK(client->Wait(client->Get(table, keys, absl::MakeSpan(after))));
  EXPECT_EQ(after, before);
  // Each server saw and counted refused handshakes.
  for (int i = 0; i < 100 && AuthFailures() < failures_before + 4; ++i) {
    absl::SleepFor(absl::Milliseconds(20));
  }
  EXPECT_GE(AuthFailures(), failures_before + 4);
}

TEST_F(AuthTest, ControlPlaneCallsNeedTheToken) {
  // The scheduler, without a token.
  SchedulerClient anonymous(suite_.cluster().scheduler_address(),
                            absl::Seconds(5));
  EXPECT_THAT(anonymous.GetClusterMap().status(),
              StatusIs(absl::StatusCode::kUnauthenticated));
  EXPECT_THAT(anonymous.GetJobStatus().status(),
              StatusIs(absl::StatusCode::kUnauthenticated));
  proto::RegisterRequest reg;
  reg.set_role(proto::SERVER);
  reg.set_data_endpoint("tcp://127.0.0.1:1");
  EXPECT_THAT(anonymous.Register(reg, absl::Seconds(5)).status(),
              StatusIs(absl::StatusCode::kUnauthenticated));
  // No node was added by the refused registration.
  const proto::ClusterMap map = Map();
  int servers = 0;
  for (const auto& n : map.nodes()) servers += n.role() == proto::SERVER;
  EXPECT_EQ(servers, 2);

  // A server's admin service: stats need the token, health does not (it is
  // what Kubernetes probes call).
  for (const auto& n : map.nodes()) {
    if (n.role() != proto::SERVER) continue;
    proto::ServerStats stats;
    grpc::Status s = GetStats(n.admin_address(), ClusterAuth(), &stats);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAUTHENTICATED);
    auto channel = NewGrpcChannel(n.admin_address(), ClusterAuth());
    grpc::ClientContext hctx;
    hctx.set_deadline(std::chrono::system_clock::now() +
                      std::chrono::seconds(5));
    grpc::health::v1::HealthCheckResponse health;
    EXPECT_TRUE(
        grpc::health::v1::Health::NewStub(channel)
            ->Check(&hctx, grpc::health::v1::HealthCheckRequest(), &health)
            .ok());
  }
}

TEST_F(AuthTest, WorkerDaemonWithAWrongSecretExitsWithTheReason) {
  const std::string dir = TestTmpDir() + "/auth";
  const std::string wrong = WriteSecret(dir + "/wrong.secret");
  Subprocess worker(
      {RunfilePath("worker/ps_worker"),
       "--scheduler=" + suite_.cluster().scheduler_address(), "--name=intruder",
       "--model=softmax", "--steps=5", "--cluster_secret_file=" + wrong},
      dir + "/intruder.log");
  ASSERT_OK(worker.Start());
  ASSERT_OK_AND_ASSIGN(int status, worker.Wait(absl::Seconds(60)));
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) != 0) << status;
  EXPECT_THAT(worker.LogTail(), ::testing::HasSubstr("UNAUTHENTICATED"));

  // A secret file that is not a key stops a daemon at start-up.
  const std::string junk = dir + "/junk.secret";
  std::ofstream(junk) << "hunter2\n";
  Subprocess server({RunfilePath("server/ps_server"),
                     "--scheduler=" + suite_.cluster().scheduler_address(),
                     "--cluster_secret_file=" + junk},
                    dir + "/junk-server.log");
  ASSERT_OK(server.Start());
  ASSERT_OK_AND_ASSIGN(int s2, server.Wait(absl::Seconds(30)));
  EXPECT_TRUE(WIFEXITED(s2) && WEXITSTATUS(s2) == 2) << s2;
  EXPECT_THAT(server.LogTail(), ::testing::HasSubstr("junk.secret"));
}

}  // namespace
}  // namespace downpour
