#include "python/src/status.h"

#include <string>

namespace downpour {
namespace python {

namespace py = pybind11;

void RegisterStatus(py::module_& m) {
  (void)m;
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const StatusError& e) {
      // The classes live in Python (downpour/errors.py), where multiple
      // inheritance from the built-in exceptions is plain.
      py::object error =
          py::module_::import("downpour.errors")
              .attr("from_status")(static_cast<int>(e.status().code()),
                                   std::string(e.status().message()));
      PyErr_SetObject(reinterpret_cast<PyObject*>(Py_TYPE(error.ptr())),
                      error.ptr());
    }
  });
}

}  // namespace python
}  // namespace downpour
