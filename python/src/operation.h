// downpour.Operation: one asynchronous SDK operation seen from Python.
//
// It holds the Python objects whose memory the SDK reads or writes (keys,
// values, the output array) until the operation completes, and the client,
// so that neither goes away under the transport. wait() blocks with the GIL
// released (other Python threads run) and polls for KeyboardInterrupt; it
// returns the output array for reads, None for writes, and raises the
// operation's error as a downpour.errors exception, as often as it is
// called. Dropping an Operation that is still in flight waits for it (at
// most the client's op_timeout plus a margin).
//
// Not thread-safe: one Python thread at a time per Operation (the GIL sees
// to that for ordinary use).
#ifndef DOWNPOUR_PYTHON_SRC_OPERATION_H_
#define DOWNPOUR_PYTHON_SRC_OPERATION_H_

#include <memory>
#include <optional>

#include "absl/status/status.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "client/client.h"
#include "pybind11/pybind11.h"

namespace downpour {
namespace python {

// Written by the SDK's completion callback, read by Operation. The status
// is written before `done` is notified and read only after.
struct Completion {
  absl::Notification done;
  absl::Status status;

  // The callback to hand the SDK; it never blocks and never touches Python.
  static Callback CallbackFor(std::shared_ptr<Completion> completion) {
    return [completion = std::move(completion)](const absl::Status& s) {
      completion->status = s;
      completion->done.Notify();
    };
  }
};

class Operation {
 public:
  // `owners`: the objects whose memory the operation uses; `result`: what
  // wait() returns (None for writes). `grace`: how long the destructor waits.
  Operation(std::shared_ptr<Client> client,
            std::shared_ptr<Completion> completion, pybind11::object owners,
            pybind11::object result, absl::Duration grace);
  ~Operation();
  Operation(const Operation&) = delete;
  Operation& operator=(const Operation&) = delete;

  // timeout_s: None waits until the operation completes (which the SDK
  // bounds by op_timeout; `grace` at most). Raises DeadlineExceededError if it
  // is still in flight after timeout_s; the operation goes on and may be waited
  // on again.
  pybind11::object Wait(std::optional<double> timeout_s);
  bool IsCompleted() const { return completion_->done.HasBeenNotified(); }

 private:
  // Drops the buffers and the client once the SDK is done with them.
  void ReleaseResources();

  std::shared_ptr<Client> client_;
  std::shared_ptr<Completion> completion_;
  pybind11::object owners_;
  pybind11::object result_;
  const absl::Duration grace_;
};

// Waits for `done` with the GIL released, checking for signals (Ctrl-C)
// every 100 ms. False on timeout; raises error_already_set on a signal.
// REQUIRES: the GIL is held.
bool WaitReleasingGil(const absl::Notification& done, absl::Duration timeout);

// Drops a client reference, releasing the GIL if this destroys the client
// (its destructor joins the SDK's threads). REQUIRES: the GIL is held.
void DropClient(std::shared_ptr<Client>* client);

}  // namespace python
}  // namespace downpour

#endif  // DOWNPOUR_PYTHON_SRC_OPERATION_H_
