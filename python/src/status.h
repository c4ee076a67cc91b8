// absl::Status on its way to Python.
//
// Binding code throws StatusError for a failed status; the translator that
// RegisterStatus installs turns it into the matching exception class of
// downpour.errors (e.g. NotFoundError, which is also a LookupError), carrying
// `.code` (downpour.StatusCode) and `.message`.
//
//   ThrowIfError(client->Wait(ticket));
//   Table t = ValueOrThrow(client->OpenTable(name));
//
// Thread-safe; throw only while holding the GIL (pybind11 translates on the
// calling thread, and the translator needs the interpreter).
#ifndef DOWNPOUR_PYTHON_SRC_STATUS_H_
#define DOWNPOUR_PYTHON_SRC_STATUS_H_

#include <exception>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "pybind11/pybind11.h"

namespace downpour {
namespace python {

class StatusError : public std::exception {
 public:
  // REQUIRES: !status.ok().
  explicit StatusError(absl::Status status)
      : status_(std::move(status)), what_(status_.ToString()) {}
  const absl::Status& status() const { return status_; }
  const char* what() const noexcept override { return what_.c_str(); }

 private:
  absl::Status status_;
  std::string what_;
};

inline void ThrowIfError(const absl::Status& status) {
  if (!status.ok()) throw StatusError(status);
}

template <typename T>
T ValueOrThrow(absl::StatusOr<T> value) {
  ThrowIfError(value.status());
  return *std::move(value);
}

// Installs the exception translator.
void RegisterStatus(pybind11::module_& m);

}  // namespace python
}  // namespace downpour

#endif  // DOWNPOUR_PYTHON_SRC_STATUS_H_
