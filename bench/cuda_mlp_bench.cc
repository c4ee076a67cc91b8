// cuda_mlp_bench: time of one LossAndGradient of the MLP on the CPU and on
// CUDA, by batch size, and their ratio. Random data of Fashion-MNIST's
// shape; the times include the GPU's copies (parameters and batch in,
// gradient out), as a worker sees them.
//
//   bazel build -c opt //bench:cuda_mlp_bench
//   bazel-bin/bench/cuda_mlp_bench --layers=784,256,10 --cpu_threads=1
//
// Each measurement runs for about --seconds after a warm-up, and at most
// --max_iters calls. Prints "cuda: skipped: no CUDA (...)" where the build
// has no CUDA or the machine no device, and still times the CPU.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "common/usage.h"
#include "models/cuda/cuda_mlp.h"
#include "models/dataset.h"
#include "models/model.h"

ABSL_FLAG(std::string, layers, "784,256,10", "MLP layer sizes");
ABSL_FLAG(std::string, batches, "64,256,1024", "batch sizes to time");
ABSL_FLAG(int32_t, cpu_threads, 1, "threads for the CPU model");
ABSL_FLAG(double, seconds, 1.0, "time per measurement");
ABSL_FLAG(int32_t, max_iters, 1000, "most calls per measurement");

namespace downpour {
namespace {

std::vector<int> ParseInts(const std::string& s) {
  std::vector<int> v;
  for (absl::string_view part : absl::StrSplit(s, ',', absl::SkipEmpty())) {
    int x;
    if (absl::SimpleAtoi(part, &x) && x > 0) v.push_back(x);
  }
  return v;
}

// Mean milliseconds per call.
double TimeMs(const Model& m, const std::vector<float>& params,
              const Dataset& data, const std::vector<int>& batch) {
  std::vector<float> grad(m.NumParams());
  for (int i = 0; i < 3; ++i) {
    m.LossAndGradient(params.data(), data, batch, grad.data());
  }
  const double budget = absl::GetFlag(FLAGS_seconds);
  const int max_iters = std::max(1, absl::GetFlag(FLAGS_max_iters));
  const auto start = std::chrono::steady_clock::now();
  int iters = 0;
  double elapsed = 0;
  do {
    m.LossAndGradient(params.data(), data, batch, grad.data());
    ++iters;
    elapsed =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
            .count();
  } while (elapsed < budget && iters < max_iters);
  return 1e3 * elapsed / iters;
}

int Main() {
  const std::vector<int> layers = ParseInts(absl::GetFlag(FLAGS_layers));
  const std::vector<int> batches = ParseInts(absl::GetFlag(FLAGS_batches));
  if (layers.size() < 2 || layers.back() < 2 || batches.empty()) {
    std::fprintf(stderr, "bad --layers or --batches\n");
    return 2;
  }
  Dataset data;
  data.num_examples = 4096;
  data.dim = layers[0];
  data.num_classes = layers.back();
  std::mt19937_64 rng(1);
  std::uniform_real_distribution<float> pixel(0.0f, 1.0f);
  std::uniform_int_distribution<int> label(0, layers.back() - 1);
  data.features.resize(size_t(data.num_examples) * data.dim);
  for (float& f : data.features) f = pixel(rng);
  for (int i = 0; i < data.num_examples; ++i) data.labels.push_back(label(rng));

  const std::unique_ptr<Model> cpu =
      MakeMlp(layers, 0, std::max(1, absl::GetFlag(FLAGS_cpu_threads)));
  std::vector<float> params(cpu->NumParams());
  cpu->Init(1, params.data());
  absl::StatusOr<std::unique_ptr<Model>> gpu = MakeCudaMlp(layers);
  if (!gpu.ok()) {
    std::printf("cuda: skipped: no CUDA (%s)\n",
                std::string(gpu.status().message()).c_str());
  }
  std::printf("%8s %12s %12s %10s\n", "batch", "cpu ms", "cuda ms", "cpu/cuda");
  std::uniform_int_distribution<int> pick(0, data.num_examples - 1);
  for (int b : batches) {
    std::vector<int> batch(b);
    for (int& i : batch) i = pick(rng);
    const double cpu_ms = TimeMs(*cpu, params, data, batch);
    if (gpu.ok()) {
      const double gpu_ms = TimeMs(**gpu, params, data, batch);
      std::printf("%8d %12.3f %12.3f %10.2f\n", b, cpu_ms, gpu_ms,
                  cpu_ms / gpu_ms);
    } else {
      std::printf("%8d %12.3f %12s %10s\n", b, cpu_ms, "skipped", "-");
    }
    std::fflush(stdout);
  }
  return 0;
}

}  // namespace
}  // namespace downpour

int main(int argc, char** argv) {
  downpour::SetUsage(
      "times the MLP on the CPU and on a CUDA GPU (usage: cuda_mlp_bench "
      "[flags])");
  absl::ParseCommandLine(argc, argv);
  return downpour::Main();
}
