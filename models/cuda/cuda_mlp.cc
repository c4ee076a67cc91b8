#include "models/cuda/cuda_mlp.h"

#include <algorithm>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "common/logging.h"
#include "models/cuda/internal/gpu_mlp.h"

namespace downpour {
namespace {

#ifdef DOWNPOUR_HAVE_CUDA

// The same checks as MakeMlp's, as a status rather than an abort.
absl::Status CheckSizes(const std::vector<int>& sizes) {
  bool ok = sizes.size() >= 2 && sizes.back() >= 2;
  for (int s : sizes) ok = ok && s >= 1;
  if (ok) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat("MLP layer sizes {", absl::StrJoin(sizes, ", "),
                   "}: need at least two, all >= 1, the last >= 2"));
}

using cuda_internal::GpuMlp;

// Rows per Evaluate chunk: bounds the device memory Evaluate adds.
constexpr int kEvalChunk = 4096;

// Blocks, NumParams and Init come from the CPU model (same layout, same
// initial values); the passes run on the GPU.
class CudaMlp final : public Model {
 public:
  CudaMlp(std::vector<int> sizes, std::unique_ptr<Model> cpu,
          std::unique_ptr<GpuMlp> gpu)
      : sizes_(std::move(sizes)), cpu_(std::move(cpu)), gpu_(std::move(gpu)) {}

  std::vector<ParamBlock> Blocks() const override { return cpu_->Blocks(); }
  size_t NumParams() const override { return cpu_->NumParams(); }
  void Init(uint64_t seed, float* params) const override {
    cpu_->Init(seed, params);
  }

  double LossAndGradient(const float* params, const Dataset& data,
                         const std::vector<int>& batch,
                         float* grad) const override {
    const int n = static_cast<int>(batch.size());
    DP_CHECK(n > 0) << "empty batch";
    DP_CHECK(data.dim == sizes_[0])
        << "data dim " << data.dim << ", model " << sizes_[0];
    absl::MutexLock lock(&mu_);
    float* x;
    int32_t* y;
    std::string error;
    DP_CHECK(gpu_->HostBatch(n, &x, &y, &error)) << error;
    // Gathered into the pinned staging buffer, then copied once.
    for (int i = 0; i < n; ++i) {
      const int idx = batch[i];
      DP_CHECK(idx >= 0 && idx < data.num_examples) << "batch index " << idx;
      const int label = data.labels[idx];
      DP_CHECK(label >= 0 && label < sizes_.back()) << "label " << label;
      std::copy_n(data.features.data() + size_t(idx) * data.dim, data.dim,
                  x + size_t(i) * data.dim);
      y[i] = label;
    }
    double loss = 0;
    DP_CHECK(gpu_->LossAndGradient(params, x, y, n, grad, &loss, &error))
        << error;
    return loss;
  }

  std::pair<double, double> Evaluate(const float* params,
                                     const Dataset& data) const override {
    if (data.num_examples == 0) return {0.0, 0.0};
    DP_CHECK(data.dim == sizes_[0])
        << "data dim " << data.dim << ", model " << sizes_[0];
    for (int32_t label : data.labels) {
      DP_CHECK(label >= 0 && label < sizes_.back()) << "label " << label;
    }
    absl::MutexLock lock(&mu_);
    const int n = data.num_examples;
    int64_t correct = 0;
    double loss = 0;
    std::string error;
    // Rows are contiguous already: copied straight from the data set.
    for (int r0 = 0; r0 < n; r0 += kEvalChunk) {
      const int rows = std::min(kEvalChunk, n - r0);
      DP_CHECK(gpu_->Evaluate(
          params, data.features.data() + size_t(r0) * data.dim,
          data.labels.data() + r0, rows, &correct, &loss, &error))
          << error;
    }
    return {static_cast<double>(correct) / n, loss / n};
  }

 private:
  const std::vector<int> sizes_;
  const std::unique_ptr<Model> cpu_;
  mutable absl::Mutex mu_;
  // Its buffers and stream serve one call at a time.
  const std::unique_ptr<GpuMlp> gpu_ ABSL_PT_GUARDED_BY(mu_);
};

// Empty when a device is usable, else why not.
std::string NoDeviceReason(int device) {
  std::string error;
  const int count = cuda_internal::DeviceCount(&error);
  if (count == 0) return error;
  if (device >= count) {
    return absl::StrCat("device ", device, " requested, ", count, " present");
  }
  return "";
}

#endif  // DOWNPOUR_HAVE_CUDA

}  // namespace

#ifdef DOWNPOUR_HAVE_CUDA

bool CudaBuilt() { return true; }

bool CudaAvailable() { return NoDeviceReason(0).empty(); }

absl::StatusOr<std::unique_ptr<Model>> MakeCudaMlp(std::vector<int> layer_sizes,
                                                   float l2, int device) {
  if (absl::Status s = CheckSizes(layer_sizes); !s.ok()) return s;
  if (device < 0) {
    return absl::InvalidArgumentError(absl::StrCat("CUDA device ", device));
  }
  if (std::string why = NoDeviceReason(device); !why.empty()) {
    return absl::FailedPreconditionError(absl::StrCat("no CUDA device: ", why));
  }
  constexpr int kInitialRows = 256;
  std::string error;
  std::unique_ptr<GpuMlp> gpu =
      GpuMlp::Create(layer_sizes, l2, device, kInitialRows, &error);
  if (gpu == nullptr) {
    const std::string msg =
        absl::StrCat("CUDA MLP on device ", device, ": ", error);
    if (error.find("MemoryAllocation") != std::string::npos ||
        error.find("ALLOC_FAILED") != std::string::npos) {
      return absl::ResourceExhaustedError(msg);
    }
    return absl::InternalError(msg);
  }
  std::unique_ptr<Model> cpu = MakeMlp(layer_sizes, l2);
  return std::unique_ptr<Model>(
      new CudaMlp(std::move(layer_sizes), std::move(cpu), std::move(gpu)));
}

#else  // !DOWNPOUR_HAVE_CUDA

bool CudaBuilt() { return false; }

bool CudaAvailable() { return false; }

absl::StatusOr<std::unique_ptr<Model>> MakeCudaMlp(std::vector<int> layer_sizes,
                                                   float l2, int device) {
  (void)layer_sizes;
  (void)l2;
  (void)device;
  return absl::UnimplementedError(
      "CUDA MLP: built without CUDA (Bazel found no nvcc; see docs/GPU.md)");
}

#endif  // DOWNPOUR_HAVE_CUDA

}  // namespace downpour
