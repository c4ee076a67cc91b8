#include "python/src/operation.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/logging.h"
#include "python/src/status.h"

namespace downpour {
namespace python {

namespace py = pybind11;

bool WaitReleasingGil(const absl::Notification& done, absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  for (;;) {
    const absl::Duration left = deadline - absl::Now();
    bool finished;
    {
      py::gil_scoped_release release;
      finished = done.WaitForNotificationWithTimeout(std::max(
          absl::ZeroDuration(), std::min(left, absl::Milliseconds(100))));
    }
    if (finished) return true;
    if (PyErr_CheckSignals() != 0) throw py::error_already_set();
    if (absl::Now() >= deadline) return false;
  }
}

void DropClient(std::shared_ptr<Client>* client) {
  if (client->use_count() == 1) {
    py::gil_scoped_release release;
    client->reset();
  } else {
    client->reset();
  }
}

Operation::Operation(std::shared_ptr<Client> client,
                     std::shared_ptr<Completion> completion, py::object owners,
                     py::object result, absl::Duration grace)
    : client_(std::move(client)),
      completion_(std::move(completion)),
      owners_(std::move(owners)),
      result_(std::move(result)),
      grace_(grace) {}

Operation::~Operation() {
  if (!completion_->done.HasBeenNotified()) {
    bool finished;
    {
      py::gil_scoped_release release;
      finished = completion_->done.WaitForNotificationWithTimeout(grace_);
    }
    if (!finished) {
      // The SDK may still write into these buffers: leak them rather than
      // free memory that is in use.
      DP_LOG(ERROR) << "an operation dropped without wait() is still in "
                       "flight after "
                    << grace_ << "; leaking its buffers";
      owners_.release();
      result_.release();
      new std::shared_ptr<Client>(std::move(client_));
      return;
    }
  }
  ReleaseResources();
}

void Operation::ReleaseResources() {
  owners_ = py::none();
  if (client_ != nullptr) DropClient(&client_);
}

py::object Operation::Wait(std::optional<double> timeout_s) {
  // As the C++ SDK's Wait does for a lone operation
  // (ClientOptions::spin_wait): on a VM a thread woken from sleep starts
  // tens of microseconds late. Not for a poll (timeout 0).
  if (!completion_->done.HasBeenNotified() && client_ != nullptr &&
      !(timeout_s && *timeout_s <= 0)) {
    // A copy, taken under the GIL: another thread's wait() on this
    // operation may drop client_ meanwhile.
    std::shared_ptr<Client> client = client_;
    const Completion& completion = *completion_;
    {
      py::gil_scoped_release release;
      client->SpinUntil(
          [&completion] { return completion.done.HasBeenNotified(); });
    }
    DropClient(&client);
  }
  if (!completion_->done.HasBeenNotified()) {
    // Without a timeout: the SDK completes every operation within its
    // op_timeout, and grace_ adds a margin to that.
    const absl::Duration timeout =
        timeout_s ? absl::Seconds(std::max(0.0, *timeout_s)) : grace_;
    if (!WaitReleasingGil(completion_->done, timeout)) {
      throw StatusError(absl::DeadlineExceededError(absl::StrCat(
          "operation not complete after ", absl::FormatDuration(timeout),
          " (it goes on; wait again)")));
    }
  }
  ReleaseResources();
  ThrowIfError(completion_->status);
  return result_;
}

}  // namespace python
}  // namespace downpour
