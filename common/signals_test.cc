#include "common/signals.h"

#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <thread>

#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"

namespace downpour {
namespace {

constexpr absl::Duration kDeadline = absl::Seconds(30);

bool Pending(int signo) {
  sigset_t pending;
  sigemptyset(&pending);
  sigpending(&pending);
  return sigismember(&pending, signo) == 1;
}

TEST(SignalsTest, TheHandlerRunsOnceOnTheSignal) {
  std::atomic<int> calls{0};
  absl::Notification called;
  TerminationHandler on_signal = OnTerminationSignal([&] {
    ++calls;
    called.Notify();
  });
  ASSERT_EQ(kill(getpid(), SIGTERM), 0);
  ASSERT_TRUE(called.WaitForNotificationWithTimeout(kDeadline));
  on_signal.Disarm();
  EXPECT_EQ(calls.load(), 1);
}

TEST(SignalsTest, DisarmWaitsForARunningHandler) {
  absl::Notification started;
  absl::Notification release;
  std::atomic<bool> finished{false};
  TerminationHandler on_signal = OnTerminationSignal([&] {
    started.Notify();
    release.WaitForNotification();
    finished = true;
  });
  ASSERT_EQ(kill(getpid(), SIGINT), 0);
  ASSERT_TRUE(started.WaitForNotificationWithTimeout(kDeadline));
  std::atomic<bool> finished_when_disarmed{false};
  std::thread disarm([&] {
    on_signal.Disarm();
    finished_when_disarmed = finished.load();
  });
  // Gives a Disarm() that did not wait the time to return early; one that
  // waits passes however long this is.
  absl::SleepFor(absl::Milliseconds(50));
  release.Notify();
  disarm.join();
  EXPECT_TRUE(finished_when_disarmed.load());
}

TEST(SignalsTest, ASignalAfterDisarmRunsNothingAndStaysBlocked) {
  std::atomic<int> calls{0};
  TerminationHandler on_signal = OnTerminationSignal([&] { ++calls; });
  on_signal.Disarm();
  ASSERT_FALSE(Pending(SIGTERM));
  ASSERT_EQ(kill(getpid(), SIGTERM), 0);
  // No thread waits for it any more and every thread blocks it: it stays
  // pending instead of running the handler or the default action.
  EXPECT_TRUE(Pending(SIGTERM));
  EXPECT_EQ(calls.load(), 0);
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGTERM);
  int signo = 0;
  EXPECT_EQ(sigwait(&set, &signo), 0);  // taken, for the tests after this
  EXPECT_EQ(signo, SIGTERM);
}

TEST(SignalsTest, AHandlerMovedFromIsDisarmedOnce) {
  absl::Notification called;
  TerminationHandler first = OnTerminationSignal([&] { called.Notify(); });
  TerminationHandler second = std::move(first);
  first.Disarm();  // moved from: nothing to do
  ASSERT_EQ(kill(getpid(), SIGTERM), 0);
  ASSERT_TRUE(called.WaitForNotificationWithTimeout(kDeadline));
  second.Disarm();
}

}  // namespace
}  // namespace downpour

int main(int argc, char** argv) {
  // Before gtest or a test starts a thread.
  downpour::BlockTerminationSignals();
  testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
