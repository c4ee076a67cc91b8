// downpour.JobMember and downpour.ConsistencyPolicy: taking part in a job
// as a worker (client/job_member.h) from Python.
#ifndef DOWNPOUR_PYTHON_SRC_JOB_MEMBER_BINDING_H_
#define DOWNPOUR_PYTHON_SRC_JOB_MEMBER_BINDING_H_

#include "pybind11/pybind11.h"

namespace downpour {
namespace python {

void RegisterJobMember(pybind11::module_& m);

}  // namespace python
}  // namespace downpour

#endif  // DOWNPOUR_PYTHON_SRC_JOB_MEMBER_BINDING_H_
