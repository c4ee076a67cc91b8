// Clean shutdown on SIGTERM and SIGINT for daemons.
//
//   int main() {
//     BlockTerminationSignals();           // before any thread starts
//     auto daemon = Daemon::Create(...);
//     TerminationHandler on_signal =
//         OnTerminationSignal([&] { daemon->Shutdown(); });
//     absl::Status status = daemon->Wait();
//     on_signal.Disarm();                  // before `daemon` goes
//     return status.ok() ? 0 : 1;
//   }
#ifndef DOWNPOUR_COMMON_SIGNALS_H_
#define DOWNPOUR_COMMON_SIGNALS_H_

#include <functional>
#include <memory>

namespace downpour {

// Blocks SIGTERM and SIGINT in this thread and every thread it starts later,
// so that only the waiter below receives them.
void BlockTerminationSignals();

// The thread that waits for the signal and runs the handler. The handler
// runs on that thread while main() may be finishing for reasons of its own,
// so main() disarms it before destroying anything the handler uses.
class [[nodiscard]] TerminationHandler {
 public:
  TerminationHandler(TerminationHandler&&) noexcept;
  TerminationHandler& operator=(TerminationHandler&&) noexcept;
  ~TerminationHandler();  // Disarm()

  // From here on a signal does nothing (it stays blocked). A handler
  // already running is waited for, so it must be bounded; never call this
  // from the handler itself.
  void Disarm();

 private:
  struct Waiter;
  explicit TerminationHandler(std::unique_ptr<Waiter> waiter);
  friend TerminationHandler OnTerminationSignal(std::function<void()>);

  std::unique_ptr<Waiter> waiter_;
};

// Starts a thread that waits for SIGTERM or SIGINT and then calls
// `on_signal` once, unless the handler returned has been disarmed first.
// BlockTerminationSignals() must have run before any thread started.
TerminationHandler OnTerminationSignal(std::function<void()> on_signal);

}  // namespace downpour

#endif  // DOWNPOUR_COMMON_SIGNALS_H_
