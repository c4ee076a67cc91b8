// downpour.Client, downpour.Table, downpour.Operation and
// downpour.TrafficStats: the client SDK (client/client.h) for Python.
#ifndef DOWNPOUR_PYTHON_SRC_CLIENT_BINDING_H_
#define DOWNPOUR_PYTHON_SRC_CLIENT_BINDING_H_

#include "pybind11/pybind11.h"

namespace downpour {
namespace python {

void RegisterClient(pybind11::module_& m);

}  // namespace python
}  // namespace downpour

#endif  // DOWNPOUR_PYTHON_SRC_CLIENT_BINDING_H_
