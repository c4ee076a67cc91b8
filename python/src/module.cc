// The extension module downpour._downpour; the package downpour (python/
// downpour/__init__.py) re-exports it with the pure-Python parts.
#include <string>

#include "common/malloc_tuning.h"
#include "common/version.h"
#include "pybind11/pybind11.h"
#include "python/src/clicklog_binding.h"
#include "python/src/client_binding.h"
#include "python/src/job_member_binding.h"
#include "python/src/status.h"

PYBIND11_MODULE(_downpour, m) {
  namespace py = pybind11;
  m.doc() = "Downpour parameter-server client (C++ SDK bindings).";
  downpour::python::RegisterStatus(m);
  downpour::python::RegisterClient(m);
  downpour::python::RegisterJobMember(m);
  // The release version (the repository's VERSION file); downpour.__version__.
  m.attr("__version__") = std::string(downpour::kVersion);
  // The pybind11 this module was built with: NumPy 2 needs pybind11 >= 2.12
  // (downpour/__init__.py checks it at import).
  m.attr("_pybind11_version") = py::make_tuple(
      PYBIND11_VERSION_MAJOR, PYBIND11_VERSION_MINOR, PYBIND11_VERSION_PATCH);
  downpour::python::RegisterClickLog(m);
  m.def("tune_allocator", &downpour::TuneAllocatorForLargeMessages,
        "Keeps large blocks in the process heap instead of fresh mmaps "
        "(common/malloc_tuning.h): on VMs where fresh pages are written ~40x "
        "slower than reused ones, this speeds up every large buffer the "
        "process allocates, PyTorch's included. Process-wide; call once, "
        "early, before threads start.");
}
