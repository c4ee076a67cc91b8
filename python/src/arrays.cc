#include "python/src/arrays.h"

#include <cstdint>
#include <string>

#include "absl/strings/str_cat.h"
#include "python/src/status.h"

namespace downpour {
namespace python {

namespace py = pybind11;

namespace {

using KeyArray = py::array_t<uint64_t, py::array::c_style>;
using FloatArray = py::array_t<float, py::array::c_style>;

std::string TypeName(const py::handle& obj) {
  return py::str(py::type::of(obj).attr("__name__"));
}

// A key from a Python integer (or anything with __index__).
uint64_t ToKey(const py::handle& item) {
  if (!PyIndex_Check(item.ptr()) || PyBool_Check(item.ptr())) {
    throw py::type_error(absl::StrCat(
        "keys must be integers (None, range, int or an integer array), got "
        "an element of type ",
        TypeName(item)));
  }
  py::int_ key = py::reinterpret_steal<py::int_>(PyNumber_Index(item.ptr()));
  if (!key) throw py::error_already_set();
  if (key < py::int_(0)) {
    throw py::value_error(absl::StrCat("negative key ",
                                       std::string(py::str(key)),
                                       " (keys are unsigned 64-bit)"));
  }
  const unsigned long long k = PyLong_AsUnsignedLongLong(key.ptr());
  if (PyErr_Occurred()) {
    PyErr_Clear();
    throw py::value_error(absl::StrCat("key ", std::string(py::str(key)),
                                       " does not fit in 64 bits"));
  }
  return k;
}

// A 1-D uint64 array holding `keys`: the array itself when it already is
// one, a converted copy of another integer array, or one filled from a
// sequence of Python integers.
KeyArray ToKeyArray(const py::handle& keys) {
  if (!py::isinstance<py::array>(keys)) {
    if (!PySequence_Check(keys.ptr()) || PyUnicode_Check(keys.ptr()) ||
        PyBytes_Check(keys.ptr())) {
      throw py::type_error(absl::StrCat(
          "keys must be None, a range, an int or a sequence or array of "
          "integers, got ",
          TypeName(keys)));
    }
    auto seq = py::reinterpret_borrow<py::sequence>(keys);
    KeyArray a(static_cast<py::ssize_t>(seq.size()));
    uint64_t* out = a.mutable_data();
    for (size_t i = 0; i < seq.size(); ++i) out[i] = ToKey(seq[i]);
    return a;
  }
  if (KeyArray::check_(keys)) {
    auto a = py::reinterpret_borrow<KeyArray>(keys);
    if (a.ndim() != 1) {
      throw py::value_error(
          absl::StrCat("keys must be 1-D, got ", a.ndim(), " dimensions"));
    }
    return a;
  }
  auto a = py::reinterpret_borrow<py::array>(keys);
  if (a.ndim() != 1) {
    throw py::value_error(
        absl::StrCat("keys must be 1-D, got ", a.ndim(), " dimensions"));
  }
  const char kind = a.dtype().kind();
  if (kind != 'i' && kind != 'u') {
    throw py::type_error(absl::StrCat(
        "keys must be integers (None, range, int or an integer array), got "
        "an array of dtype ",
        std::string(py::str(a.dtype()))));
  }
  if (a.size() == 0) return KeyArray(0);
  if (kind == 'i') {
    const auto smallest = py::cast<int64_t>(a.attr("min")());
    if (smallest < 0) {
      throw py::value_error(absl::StrCat("negative key ", smallest,
                                         " (keys are unsigned 64-bit)"));
    }
  }
  py::module_ np = py::module_::import("numpy");
  return py::reinterpret_steal<KeyArray>(
      np.attr("ascontiguousarray")(a, py::arg("dtype") = np.attr("uint64"))
          .release());
}

}  // namespace

HeldKeys ToKeys(const Table& table, const py::handle& keys) {
  HeldKeys held;
  held.owner = py::none();
  if (keys.is_none()) {
    if (table.sparse) {
      throw py::value_error(
          absl::StrCat("keys=None means every key of a dense table; table '",
                       table.name, "' is sparse"));
    }
    held.keys = Keys::Range(0, table.num_keys);
    return held;
  }
  if (PyRange_Check(keys.ptr())) {
    const py::object start = keys.attr("start"), stop = keys.attr("stop");
    const auto step = py::cast<py::int_>(keys.attr("step"));
    if (!step.equal(py::int_(1)) || start < py::int_(0)) {
      throw py::value_error(absl::StrCat(
          "a key range must be range(begin, end) with 0 <= begin and step 1, "
          "got ",
          std::string(py::repr(keys))));
    }
    if (stop < start) {
      // As the SDK would answer, but before an output array is sized.
      throw StatusError(absl::InvalidArgumentError(
          absl::StrCat("inverted key range [", std::string(py::str(start)),
                       ", ", std::string(py::str(stop)), ")")));
    }
    held.keys = Keys::Range(ToKey(start), ToKey(stop));
    return held;
  }
  KeyArray array;
  if (PyIndex_Check(keys.ptr()) && !py::isinstance<py::array>(keys)) {
    array = KeyArray(1);
    array.mutable_at(0) = ToKey(keys);
  } else {
    array = ToKeyArray(keys);
  }
  held.keys = Keys(absl::MakeConstSpan(array.data(), array.size()));
  held.owner = std::move(array);
  return held;
}

HeldInput ToInput(const py::handle& values) {
  FloatArray array;
  if (FloatArray::check_(values)) {
    array = py::reinterpret_borrow<FloatArray>(values);  // used in place
  } else {
    // Converted once (float64, a list, a strided view); NumPy raises
    // ValueError or TypeError for what cannot be read as float32.
    py::module_ np = py::module_::import("numpy");
    array = py::reinterpret_steal<FloatArray>(
        np.attr("ascontiguousarray")(values,
                                     py::arg("dtype") = np.attr("float32"))
            .release());
  }
  HeldInput held;
  held.values = absl::MakeConstSpan(array.data(), array.size());
  held.owner = std::move(array);
  return held;
}

HeldOutput ToOutput(const Table& table, uint64_t num_keys,
                    const py::handle& out) {
  HeldOutput held;
  if (out.is_none()) {
    FloatArray array({static_cast<py::ssize_t>(num_keys),
                      static_cast<py::ssize_t>(table.width)});
    held.values = absl::MakeSpan(array.mutable_data(), array.size());
    held.owner = std::move(array);
    return held;
  }
  if (!FloatArray::check_(out)) {
    throw py::type_error(absl::StrCat(
        "out must be a C-contiguous numpy.ndarray of float32 (for a CPU "
        "torch.Tensor pass tensor.numpy()), got ",
        TypeName(out),
        py::isinstance<py::array>(out)
            ? absl::StrCat(" of dtype ",
                           std::string(py::str(out.attr("dtype"))))
            : ""));
  }
  auto array = py::reinterpret_borrow<FloatArray>(out);
  if (!array.writeable()) throw py::value_error("out is read-only");
  held.values = absl::MakeSpan(array.mutable_data(), array.size());
  held.owner = std::move(array);
  return held;
}

}  // namespace python
}  // namespace downpour
