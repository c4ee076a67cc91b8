// Clean shutdown on SIGTERM and SIGINT for daemons.
//
//   int main() {
//     BlockTerminationSignals();           // before any thread starts
//     auto daemon = Daemon::Create(...);
//     OnTerminationSignal([&] { daemon->Shutdown(); });
//     return daemon->Wait().ok() ? 0 : 1;
//   }
#ifndef DOWNPOUR_COMMON_SIGNALS_H_
#define DOWNPOUR_COMMON_SIGNALS_H_

#include <functional>

namespace downpour {

// Blocks SIGTERM and SIGINT in this thread and every thread it starts later,
// so that only the waiter below receives them.
void BlockTerminationSignals();

// Starts a detached thread that waits for SIGTERM or SIGINT and then calls
// `on_signal` once.
void OnTerminationSignal(std::function<void()> on_signal);

}  // namespace downpour

#endif  // DOWNPOUR_COMMON_SIGNALS_H_
