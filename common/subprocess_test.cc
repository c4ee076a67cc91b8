#include "common/subprocess.h"

#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <atomic>
#include <thread>

#include "gtest/gtest.h"

namespace downpour {
namespace {

double ThisThreadCpuSeconds() {
  timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return ts.tv_sec + ts.tv_nsec * 1e-9;
}

// A thread that has used 0.2 s of CPU is listed with at least most of it
// (procfs counts in clock ticks), and this process's total covers it.
TEST(SubprocessTest, ThreadCpuSecondsOfFindsABusyThread) {
  std::atomic<pid_t> tid{0};
  std::atomic<bool> done{false};
  std::atomic<bool> release{false};
  std::thread busy([&] {
    tid = static_cast<pid_t>(syscall(SYS_gettid));
    volatile double x = 1;
    while (ThisThreadCpuSeconds() < 0.2) x = x * 1.0000001 + 1e-9;
    done = true;
    while (!release) std::this_thread::yield();
  });
  while (!done) std::this_thread::yield();
  const std::map<pid_t, double> threads = ThreadCpuSecondsOf(getpid());
  release = true;
  busy.join();
  ASSERT_EQ(threads.count(tid.load()), 1u);
  EXPECT_GE(threads.at(tid.load()), 0.15);
  EXPECT_GE(ProcessCpuSeconds(getpid()), threads.at(tid.load()));
  EXPECT_TRUE(ThreadCpuSecondsOf(-1).empty());
}

}  // namespace
}  // namespace downpour
