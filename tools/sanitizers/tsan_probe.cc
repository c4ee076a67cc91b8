// Two threads sharing a counter in one of several ways, for
// tsan_absl_test.cc: every way synchronized through absl must run clean
// under ThreadSanitizer, and the unsynchronized one must be reported.
//
//   tsan_probe locked|await|condvar|notification|blocking_counter|racy
#include <cstdio>
#include <cstring>
#include <thread>

#include "absl/synchronization/blocking_counter.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"

int main(int argc, char** argv) {
  if (argc != 2) return 2;
  const char* mode = argv[1];
  absl::Mutex mu;
  absl::CondVar cv;
  long counter = 0;  // guarded by mu, or handed over, or raced on
  bool ready = false;
  absl::Notification done;
  absl::BlockingCounter finished(1);
  auto writer = [&] {
    if (std::strcmp(mode, "racy") == 0) {
      for (int i = 0; i < 1000; ++i) ++counter;
      return;
    }
    if (std::strcmp(mode, "notification") == 0) {
      counter = 42;
      done.Notify();
      return;
    }
    if (std::strcmp(mode, "blocking_counter") == 0) {
      counter = 42;
      finished.DecrementCount();
      return;
    }
    absl::MutexLock lock(&mu);
    counter += 42;
    ready = true;
    if (std::strcmp(mode, "condvar") == 0) cv.Signal();
  };
  std::thread t(writer);
  if (std::strcmp(mode, "racy") == 0) {
    for (int i = 0; i < 1000; ++i) ++counter;
  } else if (std::strcmp(mode, "notification") == 0) {
    done.WaitForNotificationWithTimeout(absl::Seconds(10));
    ++counter;
  } else if (std::strcmp(mode, "blocking_counter") == 0) {
    finished.Wait();
    ++counter;
  } else if (std::strcmp(mode, "await") == 0) {
    absl::MutexLock lock(&mu);
    mu.AwaitWithTimeout(absl::Condition(&ready), absl::Seconds(10));
    ++counter;
  } else if (std::strcmp(mode, "condvar") == 0) {
    absl::MutexLock lock(&mu);
    while (!ready) cv.WaitWithTimeout(&mu, absl::Seconds(10));
    ++counter;
  } else {
    for (int i = 0; i < 1000; ++i) {
      absl::MutexLock lock(&mu);
      ++counter;
    }
  }
  t.join();
  std::printf("counter %ld\n", counter);
  return 0;
}
