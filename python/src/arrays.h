// Python arguments to the SDK's keys and value spans, without copying
// where the buffer allows.
//
// Keys: None (every key of a dense table), range(b, e) (a key range, no key
// array at all), an int, or a 1-D sequence or NumPy array of non-negative
// integers (a C-contiguous uint64 array is used in place; others are
// converted once). Values: anything NumPy can read as float32 (a
// C-contiguous float32 array is used in place). Outputs: a writable
// C-contiguous float32 NumPy array, filled in place, or None for a new
// (num_keys, width) array.
//
// Each function returns the span together with the Python object owning its
// memory, which must stay referenced until the operation completes.
// Malformed arguments raise TypeError or ValueError. Call with the GIL held.
#ifndef DOWNPOUR_PYTHON_SRC_ARRAYS_H_
#define DOWNPOUR_PYTHON_SRC_ARRAYS_H_

#include "absl/types/span.h"
#include "client/client.h"
#include "pybind11/numpy.h"
#include "pybind11/pybind11.h"

namespace downpour {
namespace python {

struct HeldKeys {
  Keys keys = Keys::Range(0, 0);
  pybind11::object owner;  // the key array, or None for a range
};
HeldKeys ToKeys(const Table& table, const pybind11::handle& keys);

struct HeldInput {
  absl::Span<const float> values;
  pybind11::object owner;
};
HeldInput ToInput(const pybind11::handle& values);

struct HeldOutput {
  absl::Span<float> values;
  pybind11::object owner;  // the array returned to the caller
};
// `out` None: a new array of shape (num_keys, table.width).
HeldOutput ToOutput(const Table& table, uint64_t num_keys,
                    const pybind11::handle& out);

}  // namespace python
}  // namespace downpour

#endif  // DOWNPOUR_PYTHON_SRC_ARRAYS_H_
