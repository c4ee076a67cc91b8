// gRPC over TLS with the real daemons. Two clusters (a scheduler and two
// servers each), certificates from tools/make_test_certs.sh:
//  - "mutual": mutual TLS, no secret: only peers with a certificate signed
//    by the cluster's CA get in; a client without the CA, with another CA,
//    without a client certificate or with one from another CA is refused
//    with UNAVAILABLE naming the cause.
//  - "tls_token": server-only TLS plus the cluster secret: clients need the
//    CA to connect and the token to be served.
// Also: daemons refuse half a TLS configuration at start, and a Sandblaster
// job (coordinator and workers: gRPC in both directions) runs under mutual
// TLS with the secret.
#include <sys/wait.h>

#include <fstream>
#include <iostream>
#include <string>
#include <vector>

#include "client/client.h"
#include "cluster/scheduler_client.h"
#include "common/auth.h"
#include "common/grpc_channel.h"
#include "common/subprocess.h"
#include "common/test_util.h"
#include "grpcpp/grpcpp.h"
#include "launch/local_cluster.h"
#include "proto/downpour.grpc.pb.h"
#include "proto/health.grpc.pb.h"
#include "testing/sandblaster_job.h"
#include "testing/test_certs.h"

namespace downpour {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

class TlsTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new std::string(TestTmpDir() + "/tls");
    ASSERT_EQ(system(("mkdir -p " + *dir_).c_str()), 0);
    ASSERT_OK(MakeTestCertificates(*dir_ + "/pki", {"node", "client"}));
    ASSERT_OK(MakeTestCertificates(*dir_ + "/other", {"node"}));
    secret_file_ = new std::string(*dir_ + "/cluster.secret");
    ASSERT_OK_AND_ASSIGN(std::string secret, ClusterAuth::NewSecret());
    std::ofstream(*secret_file_) << secret << "\n";

    LocalClusterOptions o;
    o.bin_dir = RunfilePath("");
    o.num_servers = 2;
    o.work_dir = *dir_ + "/mutual";
    ASSERT_EQ(system(("mkdir -p " + o.work_dir).c_str()), 0);
    o.tls = Pki("node");
    o.tls.mutual = true;
    ASSERT_OK_AND_ASSIGN(auto mutual, LocalCluster::Start(o));
    mutual_ = mutual.release();

    o.work_dir = *dir_ + "/tls_token";
    ASSERT_EQ(system(("mkdir -p " + o.work_dir).c_str()), 0);
    o.tls = Pki("node");
    o.cluster_secret_file = *secret_file_;
    ASSERT_OK_AND_ASSIGN(auto tls_token, LocalCluster::Start(o));
    tls_token_ = tls_token.release();
  }
  static void TearDownTestSuite() {
    for (LocalCluster* c : {mutual_, tls_token_}) {
      if (c != nullptr) {
        EXPECT_OK(c->Stop());
      }
      delete c;
    }
    mutual_ = tls_token_ = nullptr;
    delete dir_;
    delete secret_file_;
  }

  // The cluster CA's certificate `name` (as a client: CA, cert and key).
  static TlsFiles Pki(const std::string& name) {
    return TestCertificate(*dir_ + "/pki", name);
  }
  static TlsFiles OtherPki() {
    return TestCertificate(*dir_ + "/other", "node");
  }
  static TlsFiles CaOnly(const TlsFiles& from) {
    TlsFiles tls;
    tls.ca_file = from.ca_file;
    return tls;
  }
  static ClusterAuth Auth(const TlsFiles& tls, bool with_secret = false) {
    auto auth =
        ClusterAuth::Load(with_secret ? *secret_file_ : "", tls, kGrpcClient);
    EXPECT_OK(auth);
    return auth.ok() ? *auth : ClusterAuth();
  }
  // `connect_timeout`: how long a refused client keeps retrying.
  static absl::StatusOr<std::unique_ptr<Client>> Connect(
      const LocalCluster& cluster, const ClusterAuth& auth,
      absl::Duration connect_timeout = absl::Seconds(10)) {
    ClientOptions co;
    co.scheduler_address = cluster.scheduler_address();
    co.op_timeout = absl::Seconds(10);
    co.connect_timeout = connect_timeout;
    co.auth = auth;
    return Client::Connect(co);
  }
  // A table round trip through `client`.
  static void RoundTrip(Client* client, const std::string& name) {
    TableOptions t;
    t.name = name;
    t.width = 2;
    t.num_keys = 50;
    t.handler = "sum";
    ASSERT_OK_AND_ASSIGN(Table table, client->CreateTable(t));
    const std::vector<Key> keys = {0, 49, 25};
    const std::vector<float> values = {1, 2, 3, 4, 5, 6};
    ASSERT_OK(client->PutSync(table, keys, values));
    ASSERT_OK(client->PushSync(table, keys, values));
    std::vector<float> out(6);
    ASSERT_OK(client->Wait(client->Pull(table, keys, absl::MakeSpan(out))));
    EXPECT_EQ(out, (std::vector<float>{2, 4, 6, 8, 10, 12}));
  }
  static std::vector<std::string> AdminAddresses(const LocalCluster& cluster,
                                                 const ClusterAuth& auth) {
    SchedulerClient sched(cluster.scheduler_address(), absl::Seconds(10), auth);
    auto map = sched.GetClusterMap();
    EXPECT_OK(map);
    std::vector<std::string> out;
    if (!map.ok()) return out;
    for (const auto& n : map->nodes()) {
      if (n.role() == proto::SERVER) out.push_back(n.admin_address());
    }
    return out;
  }
  static grpc::Status GetStats(const std::string& address,
                               const ClusterAuth& auth) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() +
                     std::chrono::seconds(5));
    proto::ServerStats stats;
    return proto::ServerAdmin::NewStub(NewGrpcChannel(address, auth))
        ->GetStats(&ctx, proto::StatsRequest(), &stats);
  }
  static grpc::Status Health(const std::string& address,
                             const ClusterAuth& auth) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() +
                     std::chrono::seconds(5));
    grpc::health::v1::HealthCheckResponse health;
    grpc::Status s =
        grpc::health::v1::Health::NewStub(NewGrpcChannel(address, auth))
            ->Check(&ctx, grpc::health::v1::HealthCheckRequest(), &health);
    if (s.ok()) {
      EXPECT_EQ(health.status(),
                grpc::health::v1::HealthCheckResponse::SERVING);
    }
    return s;
  }

  static std::string* dir_;
  static std::string* secret_file_;
  static LocalCluster* mutual_;
  static LocalCluster* tls_token_;
};
std::string* TlsTest::dir_ = nullptr;
std::string* TlsTest::secret_file_ = nullptr;
LocalCluster* TlsTest::mutual_ = nullptr;
LocalCluster* TlsTest::tls_token_ = nullptr;

TEST_F(TlsTest, MutualTlsServesAClientWithTheRightCertificate) {
  // "client" is another certificate of the same CA than the daemons'.
  const ClusterAuth auth = Auth(Pki("client"));
  ASSERT_OK_AND_ASSIGN(auto client, Connect(*mutual_, auth));
  RoundTrip(client.get(), "mutual_ok");
  // The servers' admin and health services, over TLS.
  const std::vector<std::string> admins = AdminAddresses(*mutual_, auth);
  ASSERT_EQ(admins.size(), 2u);
  for (const std::string& admin : admins) {
    const grpc::Status stats = GetStats(admin, auth);
    EXPECT_TRUE(stats.ok()) << admin << ": " << stats.error_message();
    const grpc::Status health = Health(admin, auth);
    EXPECT_TRUE(health.ok()) << admin << ": " << health.error_message();
  }
}

// The refusals name the cause (gRPC's reason plus the flag to check).
TEST_F(TlsTest, MutualTlsRefusesClientsWithoutTheRightCredentials) {
  struct Case {
    std::string what;
    ClusterAuth auth;
    std::vector<std::string> cause;
  };
  TlsFiles other_client = Pki("client");  // the right CA to verify servers,
  other_client.cert_file = OtherPki().cert_file;  // a certificate of another
  other_client.key_file = OtherPki().key_file;    // CA to present
  const std::vector<Case> cases = {
      {"plaintext (no CA)",
       ClusterAuth(),
       {"closed a plaintext connection", "--tls_ca_file"}},
      {"another CA",
       Auth(OtherPki()),
       {"certificate verify failed", "signed by the CA in --tls_ca_file"}},
      {"no client certificate",
       Auth(CaOnly(Pki("client"))),
       {"demands client certificates", "--tls_cert_file and --tls_key_file"}},
      {"a client certificate of another CA",
       Auth(other_client),
       {"did not accept this node's --tls_cert_file"}},
  };
  const std::vector<std::string> admins =
      AdminAddresses(*mutual_, Auth(Pki("client")));
  ASSERT_EQ(admins.size(), 2u);
  for (const Case& c : cases) {
    auto client = Connect(*mutual_, c.auth, absl::Seconds(1));
    std::cerr << c.what << ": " << client.status() << "\n";
    EXPECT_THAT(client.status(), StatusIs(absl::StatusCode::kUnavailable))
        << c.what;
    for (const std::string& cause : c.cause) {
      EXPECT_THAT(std::string(client.status().message()), HasSubstr(cause))
          << c.what;
    }
    // The scheduler's address is named too.
    EXPECT_THAT(std::string(client.status().message()),
                HasSubstr(mutual_->scheduler_address()))
        << c.what;
    // A server's admin service refuses the same way.
    const grpc::Status stats = GetStats(admins[0], c.auth);
    EXPECT_EQ(stats.error_code(), grpc::StatusCode::UNAVAILABLE) << c.what;
    EXPECT_THAT(stats.error_message(), HasSubstr(c.cause[0])) << c.what;
  }
}

TEST_F(TlsTest, ServerNameOverrideIsChecked) {
  TlsFiles tls = Pki("client");
  tls.server_name = "localhost";  // in the certificates: accepted
  ASSERT_OK_AND_ASSIGN(auto client, Connect(*mutual_, Auth(tls)));
  RoundTrip(client.get(), "server_name_ok");
  tls.server_name = "elsewhere.example";  // not in them
  auto refused = Connect(*mutual_, Auth(tls), absl::Seconds(1));
  EXPECT_THAT(refused.status(), StatusIs(absl::StatusCode::kUnavailable));
  EXPECT_THAT(
      std::string(refused.status().message()),
      AllOf(HasSubstr("elsewhere.example"), HasSubstr("--tls_server_name")));
}

TEST_F(TlsTest, TlsWithTheTokenNeedsBoth) {
  const TlsFiles ca_only = CaOnly(Pki("node"));
  // Server-only TLS: a client needs no certificate, but the token.
  ASSERT_OK_AND_ASSIGN(
      auto client, Connect(*tls_token_, Auth(ca_only, /*with_secret=*/true)));
  RoundTrip(client.get(), "tls_token_ok");

  auto no_token = Connect(*tls_token_, Auth(ca_only));
  EXPECT_THAT(no_token.status(), StatusIs(absl::StatusCode::kUnauthenticated));
  EXPECT_THAT(std::string(no_token.status().message()),
              HasSubstr("carries no cluster token"));
  // The secret without the CA: refused before any token is sent.
  ASSERT_OK_AND_ASSIGN(ClusterAuth plain, ClusterAuth::FromFile(*secret_file_));
  auto no_tls = Connect(*tls_token_, plain, absl::Seconds(1));
  EXPECT_THAT(no_tls.status(), StatusIs(absl::StatusCode::kUnavailable));
  EXPECT_THAT(std::string(no_tls.status().message()),
              HasSubstr("--tls_ca_file"));

  // Admin: stats need the token, health does not (Kubernetes probes).
  const std::vector<std::string> admins =
      AdminAddresses(*tls_token_, Auth(ca_only, true));
  ASSERT_EQ(admins.size(), 2u);
  for (const std::string& admin : admins) {
    EXPECT_TRUE(GetStats(admin, Auth(ca_only, true)).ok());
    const grpc::Status s = GetStats(admin, Auth(ca_only));
    EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAUTHENTICATED);
    EXPECT_THAT(s.error_message(),
                HasSubstr("call to /downpour.proto.ServerAdmin/GetStats"));
    EXPECT_TRUE(Health(admin, Auth(ca_only)).ok());
  }
}

// Each daemon started with half a TLS configuration exits with status 2 and
// says what is missing, before it serves or calls anything.
TEST_F(TlsTest, DaemonsRefuseHalfAConfiguration) {
  const TlsFiles pki = Pki("node");
  struct Case {
    std::string binary;
    std::vector<std::string> flags;
    std::vector<std::string> missing;
  };
  const std::string sched = "--scheduler=" + mutual_->scheduler_address();
  const std::vector<Case> cases = {
      {"scheduler/ps_scheduler",
       {"--listen=127.0.0.1:0", "--tls_cert_file=" + pki.cert_file},
       {"--tls_key_file"}},
      {"scheduler/ps_scheduler",
       {"--listen=127.0.0.1:0", "--tls_cert_file=" + pki.cert_file,
        "--tls_key_file=" + pki.key_file, "--tls_mutual"},
       {"--tls_ca_file"}},
      {"server/ps_server",
       {sched, "--tls_cert_file=" + pki.cert_file,
        "--tls_key_file=" + pki.key_file},
       {"--tls_ca_file"}},
      {"server/ps_server",
       {sched, "--tls_ca_file=" + pki.ca_file},
       {"--tls_cert_file", "--tls_key_file"}},
      {"worker/ps_worker",
       {sched, "--model=softmax", "--tls_ca_file=" + pki.ca_file,
        "--tls_mutual"},
       {"--tls_cert_file", "--tls_key_file"}},
      {"lbfgs/ps_lbfgs",
       {sched, "--tls_ca_file=" + pki.ca_file},
       {"--tls_cert_file", "--tls_key_file"}},
  };
  for (size_t i = 0; i < cases.size(); ++i) {
    const Case& c = cases[i];
    std::vector<std::string> argv = {RunfilePath(c.binary)};
    argv.insert(argv.end(), c.flags.begin(), c.flags.end());
    Subprocess p(argv, absl::StrCat(*dir_, "/half", i, ".log"));
    ASSERT_OK(p.Start());
    ASSERT_OK_AND_ASSIGN(int status, p.Wait(absl::Seconds(30)));
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 2)
        << c.binary << " case " << i << ": wait status " << status << "\n"
        << p.LogTail();
    EXPECT_THAT(p.LogTail(), HasSubstr("incomplete TLS configuration"))
        << c.binary << " case " << i;
    for (const std::string& flag : c.missing) {
      EXPECT_THAT(p.LogTail(), HasSubstr("missing " + flag))
          << c.binary << " case " << i;
    }
  }
}

// gRPC in both directions of a Sandblaster job (workers call the
// coordinator's task service; everyone calls the scheduler), under mutual
// TLS with the secret: the job runs to the end.
TEST_F(TlsTest, SandblasterJobRunsUnderMutualTls) {
  SandblasterJobOptions o;
  o.bin_dir = RunfilePath("");
  o.work_dir = *dir_ + "/sandblaster";
  o.tls = Pki("node");
  o.tls.mutual = true;
  o.cluster_secret_file = *secret_file_;
  o.coordinator_flags = {
      "--problem=sparse_lr", "--data=",          "--rows=5000", "--tasks=8",
      "--max_iterations=3",  "--table=tls_lbfgs"};
  o.workers = {{}, {}};
  ASSERT_OK_AND_ASSIGN(SandblasterJobResult run, RunSandblasterJob(o));
  EXPECT_EQ(run.f.size(), 4u) << "stop: " << run.summary["stop"];
  EXPECT_EQ(run.worker_exit_codes, (std::vector<int>{0, 0}));
  EXPECT_GE(run.Num("tasks_assigned"), 4 * 8);  // >= 4 evaluations
}

}  // namespace
}  // namespace downpour
