// Runs closures one at a time, in order, on a thread of its own: where a
// thread that must not block (a data thread) hands off blocking work (a
// gRPC call to the scheduler).
//
//   SerialExecutor control;
//   control.Schedule([&] { scheduler.ReplicaReady(req); });
//
// Thread-safe. The destructor runs what is still queued, then joins.
#ifndef DOWNPOUR_COMMON_SERIAL_EXECUTOR_H_
#define DOWNPOUR_COMMON_SERIAL_EXECUTOR_H_

#include <deque>
#include <functional>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace downpour {

class SerialExecutor {
 public:
  SerialExecutor() : thread_([this] { Run(); }) {}
  ~SerialExecutor() {
    {
      absl::MutexLock lock(&mu_);
      stop_ = true;
    }
    thread_.join();
  }
  SerialExecutor(const SerialExecutor&) = delete;
  SerialExecutor& operator=(const SerialExecutor&) = delete;

  // Queues `fn`; never blocks.
  void Schedule(std::function<void()> fn) ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    queue_.push_back(std::move(fn));
  }
  // Closures queued and not yet finished.
  size_t pending() const ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    return queue_.size() + (running_ ? 1 : 0);
  }

 private:
  void Run() ABSL_LOCKS_EXCLUDED(mu_) {
    while (true) {
      std::function<void()> fn;
      {
        absl::MutexLock lock(&mu_);
        auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
          return stop_ || !queue_.empty();
        };
        mu_.Await(absl::Condition(&ready));
        if (queue_.empty()) return;  // stopping, and drained
        fn = std::move(queue_.front());
        queue_.pop_front();
        running_ = true;
      }
      fn();
      absl::MutexLock lock(&mu_);
      running_ = false;
    }
  }

  mutable absl::Mutex mu_;
  std::deque<std::function<void()>> queue_ ABSL_GUARDED_BY(mu_);
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  bool running_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace downpour

#endif  // DOWNPOUR_COMMON_SERIAL_EXECUTOR_H_
