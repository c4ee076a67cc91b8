#include "common/signals.h"

#include <pthread.h>
#include <signal.h>

#include <thread>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "common/logging.h"

namespace downpour {
namespace {

sigset_t TerminationSet() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGINT);
  return set;
}

}  // namespace

struct TerminationHandler::Waiter {
  absl::Mutex mu;
  bool disarmed ABSL_GUARDED_BY(mu) = false;
  std::thread thread;
};

void BlockTerminationSignals() {
  sigset_t set = TerminationSet();
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
}

TerminationHandler::TerminationHandler(std::unique_ptr<Waiter> waiter)
    : waiter_(std::move(waiter)) {}
TerminationHandler::TerminationHandler(TerminationHandler&&) noexcept = default;
TerminationHandler& TerminationHandler::operator=(
    TerminationHandler&& other) noexcept {
  if (this != &other) {
    Disarm();
    waiter_ = std::move(other.waiter_);
  }
  return *this;
}
TerminationHandler::~TerminationHandler() { Disarm(); }

void TerminationHandler::Disarm() {
  if (waiter_ == nullptr || !waiter_->thread.joinable()) return;
  {
    absl::MutexLock lock(&waiter_->mu);
    waiter_->disarmed = true;
  }
  // Wakes the waiter if it is still in sigwait(): a signal sent to that
  // thread alone, which it takes as "disarmed" and which dies with the
  // thread if the handler is running instead. join() then waits for a
  // running handler to return.
  pthread_kill(waiter_->thread.native_handle(), SIGTERM);
  waiter_->thread.join();
}

TerminationHandler OnTerminationSignal(std::function<void()> on_signal) {
  auto waiter = std::make_unique<TerminationHandler::Waiter>();
  TerminationHandler::Waiter* w = waiter.get();
  w->thread = std::thread([w, fn = std::move(on_signal)] {
    sigset_t set = TerminationSet();
    int signo = 0;
    sigwait(&set, &signo);
    {
      absl::MutexLock lock(&w->mu);
      if (w->disarmed) return;
    }
    DP_LOG(INFO) << "received " << (signo == SIGTERM ? "SIGTERM" : "SIGINT");
    fn();
  });
  return TerminationHandler(std::move(waiter));
}

}  // namespace downpour
