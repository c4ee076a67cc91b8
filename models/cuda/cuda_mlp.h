// The MLP of models/model.h with its forward and backward pass on a CUDA
// GPU: the matrix products through cuBLAS, the element-wise steps as small
// kernels. Same Model interface, parameter layout, blocks and Init as
// MakeMlp, so a worker can switch devices without the servers noticing.
//
//   absl::StatusOr<std::unique_ptr<Model>> m = MakeCudaMlp({784, 256, 10});
//   if (!m.ok()) ...  // kUnimplemented: built without CUDA;
//                     // kFailedPrecondition: no CUDA device
//
// Built with CUDA only where Bazel found nvcc (third_party/cuda, see
// docs/GPU.md); elsewhere the factory says so and everything still links.
#ifndef DOWNPOUR_MODELS_CUDA_CUDA_MLP_H_
#define DOWNPOUR_MODELS_CUDA_CUDA_MLP_H_

#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "models/model.h"

namespace downpour {

// Whether this binary was built with CUDA (nvcc was found at build time).
bool CudaBuilt();

// Whether MakeCudaMlp can succeed: built with CUDA and at least one device
// usable (a GPU and a driver recent enough for the runtime). Never aborts.
bool CudaAvailable();

// An MLP on CUDA device `device`, otherwise as MakeMlp(layer_sizes, l2): the
// same Blocks, NumParams and Init (Init runs on the host), and
// LossAndGradient and Evaluate that agree with the CPU model up to float
// rounding (a relative 1e-5 or so; summation order differs).
//
// Device memory is allocated here for the parameters and a batch of 256
// and grows, once, when a larger batch arrives; LossAndGradient gathers the
// batch on the host into a pinned buffer it reuses and copies it over once,
// with the parameters; it blocks until the gradient is back on the host.
// Thread-safe: calls are serialized by a mutex, as they share one stream
// and one set of buffers (use one model per thread for parallelism). The
// REQUIRES of Model are checked (abort) as on the CPU. A CUDA failure during a
// call (the device lost, out of memory for a larger batch) aborts with the CUDA
// error, since the Model interface has no error channel.
//
// Errors: kUnimplemented "built without CUDA" if nvcc was absent at build
// time; kInvalidArgument for layer sizes MakeMlp would reject, or a
// negative device; kFailedPrecondition "no CUDA device" (with CUDA's
// reason) if the machine has no usable device or none numbered `device`;
// kResourceExhausted or kInternal if creating the cuBLAS handle or the
// buffers fails.
absl::StatusOr<std::unique_ptr<Model>> MakeCudaMlp(std::vector<int> layer_sizes,
                                                   float l2 = 0,
                                                   int device = 0);

}  // namespace downpour

#endif  // DOWNPOUR_MODELS_CUDA_CUDA_MLP_H_
