// downpour._downpour's click-log classes and functions (clicklog/): the
// synthetic Criteo-shaped generator and its shard streams, the Criteo TSV
// reader, AUC and log loss, and the feature-key hash. Batches come back as
// NumPy arrays filled by C++ without the GIL. python/downpour/clicklog.py
// re-exports them with their documentation.
#ifndef DOWNPOUR_PYTHON_SRC_CLICKLOG_BINDING_H_
#define DOWNPOUR_PYTHON_SRC_CLICKLOG_BINDING_H_

#include "pybind11/pybind11.h"

namespace downpour {
namespace python {

void RegisterClickLog(pybind11::module_& m);

}  // namespace python
}  // namespace downpour

#endif  // DOWNPOUR_PYTHON_SRC_CLICKLOG_BINDING_H_
