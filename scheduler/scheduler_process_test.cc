// The real ps_scheduler binary: starts, serves, and exits 0 on SIGTERM/SIGINT.
#include <signal.h>
#include <sys/wait.h>

#include <memory>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "cluster/scheduler_client.h"
#include "common/test_util.h"

namespace downpour {
namespace {

class SchedulerProcessTest : public ::testing::TestWithParam<int> {};

TEST_P(SchedulerProcessTest, RegistersAndExitsCleanlyOnSignal) {
  const int signo = GetParam();
  const std::string dir = TestTmpDir();
  const std::string address_file =
      absl::StrCat(dir, "/scheduler_address_", signo);
  Subprocess scheduler(
      {RunfilePath("scheduler/ps_scheduler"), "--listen=127.0.0.1:0",
       absl::StrCat("--address_file=", address_file),
       "--heartbeat_interval_ms=100", "--dead_after_ms=1000"},
      absl::StrCat(dir, "/ps_scheduler_", signo, ".log"));
  ASSERT_OK(scheduler.Start());
  auto address = WaitForFile(address_file, absl::Seconds(10));
  ASSERT_OK(address) << scheduler.LogTail();
  EXPECT_TRUE(absl::StartsWith(*address, "127.0.0.1:")) << *address;

  {
    SchedulerClient client(*address, absl::Seconds(5));
    proto::RegisterRequest r;
    r.set_role(proto::SERVER);
    r.set_name("server-0");
    r.set_data_endpoint("tcp://127.0.0.1:1");
    auto reply = client.Register(r, absl::Seconds(5));
    ASSERT_OK(reply) << scheduler.LogTail();
    EXPECT_EQ(reply->node_id(), 1u);
    EXPECT_EQ(reply->heartbeat_interval_ms(), 100);
    EXPECT_OK(client.Heartbeat(reply->node_id(), reply->map().epoch()));
  }

  scheduler.Signal(signo);
  auto status = scheduler.Wait(absl::Seconds(5));
  ASSERT_OK(status) << scheduler.LogTail();
  ASSERT_TRUE(WIFEXITED(*status)) << "raw wait status " << *status << "\n"
                                  << scheduler.LogTail();
  EXPECT_EQ(WEXITSTATUS(*status), 0) << scheduler.LogTail();
}

INSTANTIATE_TEST_SUITE_P(Signals, SchedulerProcessTest,
                         ::testing::Values(SIGTERM, SIGINT));

// --minloglevel (common/log_flags.h), shared by every daemon: 2 keeps the
// INFO lines out of the log, a value outside [0, 3] stops the daemon.
TEST(SchedulerLogLevelTest, MinLogLevelFiltersAndIsChecked) {
  const std::string dir = TestTmpDir();
  const std::string address_file = dir + "/scheduler_address_quiet";
  Subprocess quiet(
      {RunfilePath("scheduler/ps_scheduler"), "--listen=127.0.0.1:0",
       "--address_file=" + address_file, "--minloglevel=2"},
      dir + "/ps_scheduler_quiet.log");
  ASSERT_OK(quiet.Start());
  ASSERT_OK(WaitForFile(address_file, absl::Seconds(10)));
  quiet.Signal(SIGTERM);
  auto status = quiet.Wait(absl::Seconds(5));
  ASSERT_OK(status);
  EXPECT_TRUE(WIFEXITED(*status) && WEXITSTATUS(*status) == 0)
      << quiet.LogTail();
  // The scheduler logs "serving on ..." and "stopped" at INFO.
  EXPECT_FALSE(absl::StrContains(quiet.LogTail(), "serving on"))
      << quiet.LogTail();
  EXPECT_FALSE(absl::StrContains(quiet.LogTail(), "stopped"))
      << quiet.LogTail();

  Subprocess loud(
      {RunfilePath("scheduler/ps_scheduler"), "--listen=127.0.0.1:0",
       "--minloglevel=0", "--address_file=" + address_file + "_loud"},
      dir + "/ps_scheduler_loud.log");
  ASSERT_OK(loud.Start());
  ASSERT_OK(WaitForFile(address_file + "_loud", absl::Seconds(10)));
  loud.Signal(SIGTERM);
  ASSERT_OK(loud.Wait(absl::Seconds(5)));
  EXPECT_TRUE(absl::StrContains(loud.LogTail(), "serving on"))
      << loud.LogTail();

  Subprocess bad({RunfilePath("scheduler/ps_scheduler"), "--listen=127.0.0.1:0",
                  "--minloglevel=7"},
                 dir + "/ps_scheduler_bad_level.log");
  ASSERT_OK(bad.Start());
  auto bad_status = bad.Wait(absl::Seconds(10));
  ASSERT_OK(bad_status);
  EXPECT_TRUE(WIFEXITED(*bad_status) && WEXITSTATUS(*bad_status) == 2)
      << bad.LogTail();
  EXPECT_TRUE(absl::StrContains(bad.LogTail(), "--minloglevel=7 outside"))
      << bad.LogTail();
}

}  // namespace
}  // namespace downpour
