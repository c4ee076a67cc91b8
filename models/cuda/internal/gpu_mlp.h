// The MLP's math on a CUDA device, behind a plain C++ interface: no CUDA or
// Abseil types here, so that only gpu_mlp.cu is compiled by nvcc and the
// rest of the project by the ordinary toolchain. Internal to models/cuda;
// cuda_mlp.cc wraps it in the Model interface, which checks the inputs.
//
// Layout and math are those of models/internal/dense_net.h: parameters are
// the blocks W0 (in x out, row-major), b0, W1, b1, ... concatenated; ReLU
// after each hidden layer; softmax cross-entropy on top.
//
// Not thread-safe: one call at a time (the device buffers are shared).
#ifndef DOWNPOUR_MODELS_CUDA_INTERNAL_GPU_MLP_H_
#define DOWNPOUR_MODELS_CUDA_INTERNAL_GPU_MLP_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace downpour {
namespace cuda_internal {

// The number of CUDA devices; 0 with the reason in *error when there is no
// usable device (no driver, no GPU, or a driver older than the runtime).
int DeviceCount(std::string* error);

class GpuMlp {
 public:
  // Creates the cuBLAS handle, a stream, and the buffers for `initial_rows`
  // rows on `device`. Returns null with the reason in *error on failure.
  // REQUIRES: sizes valid for an MLP (at least two, all >= 1, last >= 2).
  static std::unique_ptr<GpuMlp> Create(const std::vector<int>& sizes, float l2,
                                        int device, int initial_rows,
                                        std::string* error);
  virtual ~GpuMlp() = default;

  // Pinned host buffers for `rows` rows of input (rows x sizes[0]) and
  // labels, grown when needed (invalidating earlier pointers). The caller
  // gathers a batch into them, then calls LossAndGradient on them. False
  // with *error if the allocation fails.
  virtual bool HostBatch(int rows, float** x, int32_t** y,
                         std::string* error) = 0;

  // Mean cross-entropy of the `rows` rows of x (host, row-major, labels y,
  // in [0, classes)) plus l2 / 2 * sum ||W||^2; writes the gradient into
  // grad (host, NumParams floats). False with *error on a CUDA failure.
  virtual bool LossAndGradient(const float* params, const float* x,
                               const int32_t* y, int rows, float* grad,
                               double* loss, std::string* error) = 0;

  // Adds to *correct the number of rows whose arg-max logit (first on
  // ties) is the label, and to *loss_sum the sum of their cross-entropies
  // (no L2). False with *error on a CUDA failure.
  virtual bool Evaluate(const float* params, const float* x, const int32_t* y,
                        int rows, int64_t* correct, double* loss_sum,
                        std::string* error) = 0;
};

}  // namespace cuda_internal
}  // namespace downpour

#endif  // DOWNPOUR_MODELS_CUDA_INTERNAL_GPU_MLP_H_
