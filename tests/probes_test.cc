// What Kubernetes' gRPC probes see from the real daemons: readiness (the
// health service's overall status) means "registered and serving", liveness
// (the "liveness" service) holds from the start; a worker takes the rank it
// asks for (--rank, an Indexed Job's completion index).
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <memory>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/test_util.h"
#include "grpcpp/grpcpp.h"
#include "proto/health.grpc.pb.h"

namespace downpour {
namespace {

using grpc::health::v1::HealthCheckResponse;

// A port nobody listens on right now (bound, read, closed).
int FreePort() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
      getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    close(fd);
    return 0;
  }
  close(fd);
  return ntohs(addr.sin_port);
}

// The status `port` reports for `service`; UNKNOWN if it does not answer.
HealthCheckResponse::ServingStatus Health(int port,
                                          const std::string& service) {
  auto channel = grpc::CreateChannel(absl::StrCat("127.0.0.1:", port),
                                     grpc::InsecureChannelCredentials());
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(1)));
  grpc::health::v1::HealthCheckRequest req;
  req.set_service(service);
  HealthCheckResponse resp;
  const grpc::Status s =
      grpc::health::v1::Health::NewStub(channel)->Check(&ctx, req, &resp);
  if (s.error_code() == grpc::StatusCode::NOT_FOUND) {
    return HealthCheckResponse::SERVICE_UNKNOWN;
  }
  return s.ok() ? resp.status() : HealthCheckResponse::UNKNOWN;
}

// Polls until `port` reports `want` for `service`; false after `timeout`.
bool WaitHealth(int port, const std::string& service,
                HealthCheckResponse::ServingStatus want,
                absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  while (absl::Now() < deadline) {
    if (Health(port, service) == want) return true;
    absl::SleepFor(absl::Milliseconds(20));
  }
  return false;
}

int ExitCode(Subprocess& p, absl::Duration timeout) {
  auto status = p.Wait(timeout);
  if (!status.ok() || !WIFEXITED(*status)) return -1;
  return WEXITSTATUS(*status);
}

TEST(ProbesTest, ReadyOnlyOnceRegisteredAndRanksAsAsked) {
  const std::string dir = TestTmpDir();
  const int scheduler_port = FreePort();
  const int admin_port = FreePort();
  const int health_port = FreePort();
  ASSERT_GT(scheduler_port, 0);
  const std::string scheduler = absl::StrCat("127.0.0.1:", scheduler_port);

  // The server and a worker start before the scheduler, as pods may.
  Subprocess server({RunfilePath("server/ps_server"),
                     absl::StrCat("--scheduler=", scheduler), "--name=server-0",
                     absl::StrCat("--admin_listen=127.0.0.1:", admin_port)},
                    dir + "/server.log");
  ASSERT_OK(server.Start());
  Subprocess worker(
      {RunfilePath("worker/ps_worker"), absl::StrCat("--scheduler=", scheduler),
       "--name=worker-1", "--rank=1", "--model=softmax", "--steps=5",
       absl::StrCat("--health_listen=127.0.0.1:", health_port)},
      dir + "/worker.log");
  ASSERT_OK(worker.Start());

  // Alive but not ready while the scheduler is away.
  ASSERT_TRUE(WaitHealth(admin_port, "liveness", HealthCheckResponse::SERVING,
                         absl::Seconds(10)))
      << server.LogTail();
  ASSERT_TRUE(WaitHealth(health_port, "liveness", HealthCheckResponse::SERVING,
                         absl::Seconds(10)))
      << worker.LogTail();
  for (int i = 0; i < 5; ++i) {
    EXPECT_EQ(Health(admin_port, ""), HealthCheckResponse::NOT_SERVING);
    EXPECT_EQ(Health(health_port, ""), HealthCheckResponse::NOT_SERVING);
    absl::SleepFor(absl::Milliseconds(100));
  }
  EXPECT_EQ(Health(admin_port, "no-such-service"),
            HealthCheckResponse::SERVICE_UNKNOWN);

  // Two workers in the job: the one above waits for the other at the
  // initial barrier, registered, so its readiness can be seen.
  Subprocess sched({RunfilePath("scheduler/ps_scheduler"),
                    absl::StrCat("--listen=", scheduler), "--num_workers=2"},
                   dir + "/scheduler.log");
  ASSERT_OK(sched.Start());
  ASSERT_TRUE(WaitHealth(scheduler_port, "", HealthCheckResponse::SERVING,
                         absl::Seconds(10)))
      << sched.LogTail();
  EXPECT_EQ(Health(scheduler_port, "liveness"), HealthCheckResponse::SERVING);
  ASSERT_TRUE(WaitHealth(admin_port, "", HealthCheckResponse::SERVING,
                         absl::Seconds(40)))
      << server.LogTail();
  ASSERT_TRUE(WaitHealth(health_port, "", HealthCheckResponse::SERVING,
                         absl::Seconds(40)))
      << worker.LogTail();
  EXPECT_TRUE(absl::StrContains(worker.LogTail(100000), "rank 1 of 2"))
      << worker.LogTail();

  // A second pod of index 1 while the first is alive is refused.
  Subprocess twin(
      {RunfilePath("worker/ps_worker"), absl::StrCat("--scheduler=", scheduler),
       "--name=worker-1b", "--rank=1", "--model=softmax", "--steps=5"},
      dir + "/twin.log");
  ASSERT_OK(twin.Start());
  EXPECT_EQ(ExitCode(twin, absl::Seconds(30)), 1) << twin.LogTail();
  EXPECT_TRUE(absl::StrContains(twin.LogTail(), "ALREADY_EXISTS") ||
              absl::StrContains(twin.LogTail(), "AlreadyExists") ||
              absl::StrContains(twin.LogTail(), "is held by worker 'worker-1'"))
      << twin.LogTail();
  // Outside the job's ranks.
  Subprocess stray(
      {RunfilePath("worker/ps_worker"), absl::StrCat("--scheduler=", scheduler),
       "--name=worker-7", "--rank=7", "--model=softmax", "--steps=5"},
      dir + "/stray.log");
  ASSERT_OK(stray.Start());
  EXPECT_EQ(ExitCode(stray, absl::Seconds(30)), 1) << stray.LogTail();
  EXPECT_TRUE(absl::StrContains(stray.LogTail(), "rank 7")) << stray.LogTail();

  // ps_worker does not stop on SIGTERM yet (another change); end it here.
  worker.Signal(SIGKILL);
  ASSERT_OK(worker.Wait(absl::Seconds(10)).status());

  // SIGTERM: the server leaves at once and cleanly, then the scheduler.
  server.Signal(SIGTERM);
  EXPECT_EQ(ExitCode(server, absl::Seconds(20)), 0) << server.LogTail();
  sched.Signal(SIGTERM);
  EXPECT_EQ(ExitCode(sched, absl::Seconds(20)), 0) << sched.LogTail();
}

}  // namespace
}  // namespace downpour
