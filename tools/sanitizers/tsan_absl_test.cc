// Checks tools/sanitizers/tsan_absl.cc under --config=tsan: counters shared
// through absl::Mutex (Lock, Await, CondVar), Notification and
// BlockingCounter run clean, and an unsynchronized one is still reported,
// so the annotations neither invent races nor hide them. Skipped in builds
// without ThreadSanitizer.
#include <sys/wait.h>

#include <string>

#include "common/subprocess.h"
#include "common/test_util.h"

namespace downpour {
namespace {

#if defined(__SANITIZE_THREAD__)
constexpr bool kTsan = true;
#else
constexpr bool kTsan = false;
#endif

struct Outcome {
  int exit_code = -1;
  std::string log;
};

Outcome Probe(const std::string& mode) {
  Subprocess p({RunfilePath("tools/sanitizers/tsan_probe"), mode},
               TestTmpDir() + "/tsan_probe_" + mode + ".log");
  Outcome out;
  EXPECT_OK(p.Start());
  auto status = p.Wait(absl::Seconds(60));
  EXPECT_OK(status);
  if (status.ok() && WIFEXITED(*status)) out.exit_code = WEXITSTATUS(*status);
  out.log = p.LogTail(20000);
  return out;
}

TEST(TsanAbslTest, SynchronizedThroughAbslIsClean) {
  if (!kTsan) GTEST_SKIP() << "not a ThreadSanitizer build";
  for (const char* mode :
       {"locked", "await", "condvar", "notification", "blocking_counter"}) {
    const Outcome o = Probe(mode);
    EXPECT_EQ(o.exit_code, 0) << mode << ":\n" << o.log;
    EXPECT_THAT(o.log, ::testing::Not(::testing::HasSubstr("ThreadSanitizer")))
        << mode;
  }
}

TEST(TsanAbslTest, AnUnsynchronizedCounterIsReported) {
  if (!kTsan) GTEST_SKIP() << "not a ThreadSanitizer build";
  const Outcome o = Probe("racy");
  EXPECT_NE(o.exit_code, 0) << o.log;
  EXPECT_THAT(o.log,
              ::testing::HasSubstr("WARNING: ThreadSanitizer: data race"));
}

}  // namespace
}  // namespace downpour
