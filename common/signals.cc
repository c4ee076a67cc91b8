#include "common/signals.h"

#include <signal.h>

#include <thread>

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

void BlockTerminationSignals() {
  sigset_t set = TerminationSet();
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
}

void OnTerminationSignal(std::function<void()> on_signal) {
  std::thread([fn = std::move(on_signal)] {
    sigset_t set = TerminationSet();
    int signo = 0;
    sigwait(&set, &signo);
    DP_LOG(INFO) << "received " << (signo == SIGTERM ? "SIGTERM" : "SIGINT");
    fn();
  }).detach();
}

}  // namespace downpour
