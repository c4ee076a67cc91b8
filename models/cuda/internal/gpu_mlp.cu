// GpuMlp on CUDA: the matrix products through cuBLAS, the element-wise
// steps (bias and ReLU, ReLU's backward, softmax cross-entropy and its
// gradient, the L2 gradient) as small kernels. See gpu_mlp.h.
//
// cuBLAS is column-major and our matrices are row-major, so every row-major
// M (r x c) is handed to cuBLAS as the column-major M^T (c x r) with leading
// dimension c; the products below are the row-major ones transposed:
//   Z = A W        ->  Z^T = W^T A^T          gemm(N, N)
//   gW = A^T D     ->  gW^T = D^T A           gemm(N, T)
//   B = D W^T      ->  B^T = W D^T            gemm(T, N)
//   gb = 1^T D     ->  gb = D^T 1             gemv(N)
// cuBLAS runs in its default math mode (no TF32), so results match the CPU
// up to summation order.
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cfloat>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "models/cuda/internal/gpu_mlp.h"

namespace downpour {
namespace cuda_internal {
namespace {

#define GPU_TRY(expr)                                                          \
  do {                                                                         \
    const cudaError_t gpu_err_ = (expr);                                       \
    if (gpu_err_ != cudaSuccess) {                                             \
      *error = std::string(#expr) + ": " + cudaGetErrorName(gpu_err_) + " (" + \
               cudaGetErrorString(gpu_err_) + ")";                             \
      return false;                                                            \
    }                                                                          \
  } while (false)

#define BLAS_TRY(expr)                                                       \
  do {                                                                       \
    const cublasStatus_t blas_err_ = (expr);                                 \
    if (blas_err_ != CUBLAS_STATUS_SUCCESS) {                                \
      *error = std::string(#expr) + ": " + cublasGetStatusString(blas_err_); \
      return false;                                                          \
    }                                                                        \
  } while (false)

constexpr int kThreads = 256;
constexpr int kWarp = 32;

int Blocks(int64_t n) {
  return static_cast<int>(
      std::min<int64_t>((n + kThreads - 1) / kThreads, int64_t{1} << 16));
}

// z[i][j] += b[j], then max(z, 0) if relu; z is row-major with `cols`.
__global__ void BiasActKernel(float* z, const float* b, int64_t n, int cols,
                              bool relu) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    const float v = z[i] + b[i % cols];
    z[i] = relu ? fmaxf(v, 0.0f) : v;
  }
}

// ReLU passes the gradient where its output h was positive.
__global__ void ReluBackwardKernel(float* d, const float* h, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    if (!(h[i] > 0.0f)) d[i] = 0.0f;
  }
}

// dst = a * src: the L2 term's gradient, which the weight gradient's gemm
// then adds to (beta = 1).
__global__ void ScaleCopyKernel(float* dst, const float* src, float a,
                                int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    dst[i] = a * src[i];
  }
}

__global__ void FillKernel(float* p, float v, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    p[i] = v;
  }
}

// One warp per row of the logits z (rows x classes). Writes the row's
// cross-entropy lse - z[y] to row_loss; if correct is not null, whether the
// first arg-max is y; if delta is not null, the gradient
// scale * (softmax(z) - onehot(y)), which may overwrite z in place.
__global__ void SoftmaxXentKernel(const float* z, const int32_t* y, int rows,
                                  int classes, float scale, float* delta,
                                  float* row_loss, int32_t* correct) {
  const int row = (blockIdx.x * blockDim.x + threadIdx.x) / kWarp;
  const int lane = threadIdx.x % kWarp;
  if (row >= rows) return;  // whole warps leave together
  const float* zr = z + int64_t{row} * classes;
  const int label = y[row];
  const float z_label = zr[label];
  // Max and first arg-max, shifted log-sum-exp as on the CPU.
  float m = -FLT_MAX;
  int arg = 0;
  for (int j = lane; j < classes; j += kWarp) {
    if (zr[j] > m) {
      m = zr[j];
      arg = j;
    }
  }
  for (int o = kWarp / 2; o > 0; o /= 2) {
    const float om = __shfl_xor_sync(0xffffffffu, m, o);
    const int oa = __shfl_xor_sync(0xffffffffu, arg, o);
    if (om > m || (om == m && oa < arg)) {
      m = om;
      arg = oa;
    }
  }
  float s = 0.0f;
  for (int j = lane; j < classes; j += kWarp) s += expf(zr[j] - m);
  for (int o = kWarp / 2; o > 0; o /= 2) {
    s += __shfl_xor_sync(0xffffffffu, s, o);
  }
  const float lse = m + logf(s);
  if (lane == 0) {
    row_loss[row] = lse - z_label;
    if (correct != nullptr) correct[row] = arg == label;
  }
  if (delta == nullptr) return;
  __syncwarp();  // every lane has read z before any overwrites it
  float* dr = delta + int64_t{row} * classes;
  for (int j = lane; j < classes; j += kWarp) {
    dr[j] = scale * (expf(zr[j] - lse) - (j == label ? 1.0f : 0.0f));
  }
}

// A device allocation that only grows.
template <typename T>
struct DeviceBuffer {
  T* p = nullptr;
  size_t size = 0;
  DeviceBuffer() = default;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  ~DeviceBuffer() { cudaFree(p); }
  bool Reserve(size_t n, std::string* error) {
    if (n <= size) return true;
    cudaFree(p);
    p = nullptr;
    size = 0;
    GPU_TRY(cudaMalloc(reinterpret_cast<void**>(&p), n * sizeof(T)));
    size = n;
    return true;
  }
};

// Pinned host memory, so that copies to and from the device are DMA.
template <typename T>
struct PinnedBuffer {
  T* p = nullptr;
  size_t size = 0;
  PinnedBuffer() = default;
  PinnedBuffer(const PinnedBuffer&) = delete;
  PinnedBuffer& operator=(const PinnedBuffer&) = delete;
  ~PinnedBuffer() { cudaFreeHost(p); }
  bool Reserve(size_t n, std::string* error) {
    if (n <= size) return true;
    cudaFreeHost(p);
    p = nullptr;
    size = 0;
    GPU_TRY(cudaMallocHost(reinterpret_cast<void**>(&p), n * sizeof(T)));
    size = n;
    return true;
  }
};

class GpuMlpImpl final : public GpuMlp {
 public:
  GpuMlpImpl(std::vector<int> sizes, float l2, int device)
      : sizes_(std::move(sizes)), l2_(l2), device_(device) {
    for (size_t l = 0; l + 1 < sizes_.size(); ++l) {
      w_off_.push_back(num_params_);
      num_params_ += size_t(sizes_[l]) * sizes_[l + 1];
      b_off_.push_back(num_params_);
      num_params_ += sizes_[l + 1];
      max_width_ = std::max(max_width_, sizes_[l + 1]);
    }
    act_ = std::make_unique<DeviceBuffer<float>[]>(num_layers());
  }

  ~GpuMlpImpl() override {
    cudaSetDevice(device_);
    if (blas_ != nullptr) cublasDestroy(blas_);
    if (stream_ != nullptr) cudaStreamDestroy(stream_);
  }

  bool Init(int initial_rows, std::string* error) {
    GPU_TRY(cudaSetDevice(device_));
    GPU_TRY(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    BLAS_TRY(cublasCreate(&blas_));
    BLAS_TRY(cublasSetStream(blas_, stream_));
    if (!params_.Reserve(num_params_, error) ||
        !grad_.Reserve(num_params_, error) ||
        !norms_.Reserve(num_layers(), error) ||
        !h_norms_.Reserve(num_layers(), error)) {
      return false;
    }
    float* x;
    int32_t* y;
    return ReserveRows(initial_rows, error) &&
           HostBatch(initial_rows, &x, &y, error);
  }

  bool HostBatch(int rows, float** x, int32_t** y,
                 std::string* error) override {
    if (!h_x_.Reserve(size_t(rows) * sizes_[0], error) ||
        !h_y_.Reserve(rows, error)) {
      return false;
    }
    *x = h_x_.p;
    *y = h_y_.p;
    return true;
  }

  bool LossAndGradient(const float* params, const float* x, const int32_t* y,
                       int rows, float* grad, double* loss,
                       std::string* error) override {
    GPU_TRY(cudaSetDevice(device_));
    if (!ReserveRows(rows, error)) return false;
    if (!Forward(params, x, y, rows, error)) return false;
    // The logits become the gradient of the mean loss with respect to them.
    SoftmaxXentKernel<<<(rows + kThreads / kWarp - 1) / (kThreads / kWarp),
                        kThreads, 0, stream_>>>(
        delta_[0].p, y_.p, rows, sizes_.back(), 1.0f / rows, delta_[0].p,
        row_loss_.p, nullptr);
    GPU_TRY(cudaGetLastError());
    int cur = 0;
    const float one = 1.0f, zero = 0.0f;
    for (int l = num_layers() - 1; l >= 0; --l) {
      const int in = sizes_[l], out = sizes_[l + 1];
      const float* a = l == 0 ? x_.p : act_[l - 1].p;
      const float* w = params_.p + w_off_[l];
      float* gw = grad_.p + w_off_[l];
      const size_t nw = size_t(in) * out;
      if (l2_ != 0.0f) {
        ScaleCopyKernel<<<Blocks(nw), kThreads, 0, stream_>>>(gw, w, l2_, nw);
        GPU_TRY(cudaGetLastError());
      }
      BLAS_TRY(cublasSgemm(blas_, CUBLAS_OP_N, CUBLAS_OP_T, out, in, rows, &one,
                           delta_[cur].p, out, a, in,
                           l2_ != 0.0f ? &one : &zero, gw, out));
      BLAS_TRY(cublasSgemv(blas_, CUBLAS_OP_N, out, rows, &one, delta_[cur].p,
                           out, ones_.p, 1, &zero, grad_.p + b_off_[l], 1));
      if (l > 0) {
        BLAS_TRY(cublasSgemm(blas_, CUBLAS_OP_T, CUBLAS_OP_N, in, rows, out,
                             &one, w, out, delta_[cur].p, out, &zero,
                             delta_[1 - cur].p, in));
        const int64_t n = int64_t{rows} * in;
        ReluBackwardKernel<<<Blocks(n), kThreads, 0, stream_>>>(
            delta_[1 - cur].p, act_[l - 1].p, n);
        GPU_TRY(cudaGetLastError());
        cur = 1 - cur;
      }
    }
    if (l2_ != 0.0f) {
      BLAS_TRY(cublasSetPointerMode(blas_, CUBLAS_POINTER_MODE_DEVICE));
      for (int l = 0; l < num_layers(); ++l) {
        const int nw = sizes_[l] * sizes_[l + 1];
        const float* w = params_.p + w_off_[l];
        BLAS_TRY(cublasSdot(blas_, nw, w, 1, w, 1, norms_.p + l));
      }
      BLAS_TRY(cublasSetPointerMode(blas_, CUBLAS_POINTER_MODE_HOST));
      GPU_TRY(cudaMemcpyAsync(h_norms_.p, norms_.p,
                              num_layers() * sizeof(float),
                              cudaMemcpyDeviceToHost, stream_));
    }
    GPU_TRY(cudaMemcpyAsync(h_row_loss_.p, row_loss_.p, rows * sizeof(float),
                            cudaMemcpyDeviceToHost, stream_));
    GPU_TRY(cudaMemcpyAsync(grad, grad_.p, num_params_ * sizeof(float),
                            cudaMemcpyDeviceToHost, stream_));
    GPU_TRY(cudaStreamSynchronize(stream_));
    double sum = 0;
    for (int i = 0; i < rows; ++i) sum += h_row_loss_.p[i];
    sum /= rows;
    if (l2_ != 0.0f) {
      for (int l = 0; l < num_layers(); ++l) {
        sum += 0.5 * static_cast<double>(l2_) * h_norms_.p[l];
      }
    }
    *loss = sum;
    return true;
  }

  bool Evaluate(const float* params, const float* x, const int32_t* y, int rows,
                int64_t* correct, double* loss_sum,
                std::string* error) override {
    GPU_TRY(cudaSetDevice(device_));
    if (!ReserveRows(rows, error)) return false;
    if (!Forward(params, x, y, rows, error)) return false;
    SoftmaxXentKernel<<<(rows + kThreads / kWarp - 1) / (kThreads / kWarp),
                        kThreads, 0, stream_>>>(delta_[0].p, y_.p, rows,
                                                sizes_.back(), 1.0f, nullptr,
                                                row_loss_.p, row_correct_.p);
    GPU_TRY(cudaGetLastError());
    GPU_TRY(cudaMemcpyAsync(h_row_loss_.p, row_loss_.p, rows * sizeof(float),
                            cudaMemcpyDeviceToHost, stream_));
    GPU_TRY(cudaMemcpyAsync(h_row_correct_.p, row_correct_.p,
                            rows * sizeof(int32_t), cudaMemcpyDeviceToHost,
                            stream_));
    GPU_TRY(cudaStreamSynchronize(stream_));
    for (int i = 0; i < rows; ++i) {
      *loss_sum += h_row_loss_.p[i];
      *correct += h_row_correct_.p[i];
    }
    return true;
  }

 private:
  int num_layers() const { return static_cast<int>(sizes_.size()) - 1; }

  // Grows every per-row buffer to `rows` rows if it is smaller.
  bool ReserveRows(int rows, std::string* error) {
    if (rows <= rows_) return true;
    const size_t n = rows;
    for (int l = 0; l + 1 < num_layers(); ++l) {
      if (!act_[l].Reserve(n * sizes_[l + 1], error)) return false;
    }
    if (!x_.Reserve(n * sizes_[0], error) || !y_.Reserve(n, error) ||
        !delta_[0].Reserve(n * max_width_, error) ||
        !delta_[1].Reserve(n * max_width_, error) ||
        !row_loss_.Reserve(n, error) || !row_correct_.Reserve(n, error) ||
        !ones_.Reserve(n, error) || !h_row_loss_.Reserve(n, error) ||
        !h_row_correct_.Reserve(n, error)) {
      return false;
    }
    FillKernel<<<Blocks(n), kThreads, 0, stream_>>>(ones_.p, 1.0f, n);
    GPU_TRY(cudaGetLastError());
    rows_ = rows;
    return true;
  }

  // Uploads the parameters and the batch, and leaves the logits in
  // delta_[0] and each hidden layer's output in act_.
  bool Forward(const float* params, const float* x, const int32_t* y, int rows,
               std::string* error) {
    GPU_TRY(cudaMemcpyAsync(params_.p, params, num_params_ * sizeof(float),
                            cudaMemcpyHostToDevice, stream_));
    GPU_TRY(cudaMemcpyAsync(x_.p, x, size_t(rows) * sizes_[0] * sizeof(float),
                            cudaMemcpyHostToDevice, stream_));
    GPU_TRY(cudaMemcpyAsync(y_.p, y, rows * sizeof(int32_t),
                            cudaMemcpyHostToDevice, stream_));
    const float one = 1.0f, zero = 0.0f;
    for (int l = 0; l < num_layers(); ++l) {
      const int in = sizes_[l], out = sizes_[l + 1];
      const bool hidden = l + 1 < num_layers();
      const float* a = l == 0 ? x_.p : act_[l - 1].p;
      float* z = hidden ? act_[l].p : delta_[0].p;
      BLAS_TRY(cublasSgemm(blas_, CUBLAS_OP_N, CUBLAS_OP_N, out, rows, in, &one,
                           params_.p + w_off_[l], out, a, in, &zero, z, out));
      const int64_t n = int64_t{rows} * out;
      BiasActKernel<<<Blocks(n), kThreads, 0, stream_>>>(
          z, params_.p + b_off_[l], n, out, hidden);
      GPU_TRY(cudaGetLastError());
    }
    return true;
  }

  const std::vector<int> sizes_;
  const float l2_;
  const int device_;
  std::vector<size_t> w_off_, b_off_;
  size_t num_params_ = 0;
  int max_width_ = 0;  // widest layer output

  cudaStream_t stream_ = nullptr;
  cublasHandle_t blas_ = nullptr;
  // Sized once.
  DeviceBuffer<float> params_, grad_, norms_;
  PinnedBuffer<float> h_norms_;
  // Per row, grown to the largest batch seen (rows_ rows).
  int rows_ = 0;
  DeviceBuffer<float> x_;
  DeviceBuffer<int32_t> y_;
  std::unique_ptr<DeviceBuffer<float>[]> act_;  // hidden layers' outputs
  DeviceBuffer<float> delta_[2];                // logits, then gradients
  DeviceBuffer<float> row_loss_, ones_;
  DeviceBuffer<int32_t> row_correct_;
  PinnedBuffer<float> h_row_loss_;
  PinnedBuffer<int32_t> h_row_correct_;
  // The caller's batch staging area (HostBatch).
  PinnedBuffer<float> h_x_;
  PinnedBuffer<int32_t> h_y_;
};

}  // namespace

int DeviceCount(std::string* error) {
  int n = 0;
  const cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) {
    *error =
        std::string(cudaGetErrorName(e)) + " (" + cudaGetErrorString(e) + ")";
    if (e == cudaErrorInsufficientDriver) {
      *error += ": no NVIDIA driver, or one older than this CUDA runtime";
    }
    cudaGetLastError();  // clear it, so later calls do not report it again
    return 0;
  }
  if (n == 0) *error = "cudaGetDeviceCount reports 0 devices";
  return n;
}

std::unique_ptr<GpuMlp> GpuMlp::Create(const std::vector<int>& sizes, float l2,
                                       int device, int initial_rows,
                                       std::string* error) {
  auto m = std::make_unique<GpuMlpImpl>(sizes, l2, device);
  if (!m->Init(std::max(initial_rows, 1), error)) return nullptr;
  return m;
}

}  // namespace cuda_internal
}  // namespace downpour
