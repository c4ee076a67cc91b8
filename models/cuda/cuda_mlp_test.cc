// The CUDA MLP against the CPU MLP (the reference): same blocks and initial
// values, loss, gradient and evaluation within float tolerance, on random
// data and on real Fashion-MNIST examples. Those comparisons skip, saying
// why, where the build has no CUDA or the machine no device; the factory's
// error codes are checked everywhere.
#include "models/cuda/cuda_mlp.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_join.h"
#include "common/test_util.h"
#include "models/dataset.h"
#include "models/model.h"

namespace downpour {
namespace {

using ::testing::HasSubstr;

constexpr char kFashionMnist[] = "/usr/share/datasets/fashion-mnist";

// The factory's answer on this build and machine; tests that need a GPU
// skip with its message.
TEST(CudaMlpFactoryTest, SaysWhyItCannotRun) {
  absl::StatusOr<std::unique_ptr<Model>> m = MakeCudaMlp({784, 256, 10});
  if (!CudaBuilt()) {
    std::printf("path: built without CUDA\n");
    EXPECT_FALSE(CudaAvailable());
    EXPECT_THAT(m, StatusIs(absl::StatusCode::kUnimplemented));
    EXPECT_THAT(std::string(m.status().message()),
                HasSubstr("built without CUDA"));
  } else if (!CudaAvailable()) {
    std::printf("path: CUDA built, no device: %s\n",
                std::string(m.status().message()).c_str());
    EXPECT_THAT(m, StatusIs(absl::StatusCode::kFailedPrecondition));
    EXPECT_THAT(std::string(m.status().message()), HasSubstr("no CUDA device"));
  } else {
    std::printf("path: CUDA device present\n");
    ASSERT_OK(m);
    EXPECT_EQ((*m)->NumParams(), MakeMlp({784, 256, 10})->NumParams());
  }
}

TEST(CudaMlpFactoryTest, RejectsBadArguments) {
  const std::vector<std::vector<int>> bad = {{784}, {784, 1}, {784, 0, 10}};
  for (const auto& sizes : bad) {
    SCOPED_TRACE(absl::StrJoin(sizes, ","));
    EXPECT_THAT(MakeCudaMlp(sizes),
                StatusIs(CudaBuilt() ? absl::StatusCode::kInvalidArgument
                                     : absl::StatusCode::kUnimplemented));
  }
  EXPECT_THAT(MakeCudaMlp({4, 3}, 0, /*device=*/-1),
              StatusIs(CudaBuilt() ? absl::StatusCode::kInvalidArgument
                                   : absl::StatusCode::kUnimplemented));
  // No machine has this many: the device-count path, even with a GPU.
  auto far = MakeCudaMlp({4, 3}, 0, /*device=*/1000);
  EXPECT_THAT(far, StatusIs(CudaBuilt() ? absl::StatusCode::kFailedPrecondition
                                        : absl::StatusCode::kUnimplemented));
  if (CudaBuilt()) {
    EXPECT_THAT(std::string(far.status().message()),
                HasSubstr("no CUDA device"));
  }
}

Dataset RandomData(int n, int dim, int classes, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_int_distribution<int> label(0, classes - 1);
  Dataset d;
  d.num_examples = n;
  d.dim = dim;
  d.num_classes = classes;
  d.features.resize(size_t(n) * dim);
  for (float& f : d.features) f = normal(rng);
  for (int i = 0; i < n; ++i) d.labels.push_back(label(rng));
  return d;
}

// Indices with repeats, as the workers' batchers may draw them.
std::vector<int> RandomBatch(int size, int num_examples, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int> pick(0, num_examples - 1);
  std::vector<int> batch(size);
  for (int& i : batch) i = pick(rng);
  return batch;
}

class CudaMlpTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!CudaBuilt()) {
      GTEST_SKIP() << "built without CUDA: Bazel found no nvcc (docs/GPU.md)";
    }
    if (!CudaAvailable()) {
      GTEST_SKIP() << MakeCudaMlp({2, 2}).status().message();
    }
  }

  std::unique_ptr<Model> Gpu(const std::vector<int>& sizes, float l2) {
    auto m = MakeCudaMlp(sizes, l2);
    EXPECT_OK(m);
    return m.ok() ? std::move(*m) : nullptr;
  }

  // Runs both models on `batch` and compares; `params` from the CPU Init.
  void CompareStep(const Model& cpu, const Model& gpu,
                   const std::vector<float>& params, const Dataset& data,
                   const std::vector<int>& batch) {
    SCOPED_TRACE(::testing::Message() << "batch of " << batch.size());
    std::vector<float> gc(cpu.NumParams()), gg(cpu.NumParams(), -7.0f);
    const double lc =
        cpu.LossAndGradient(params.data(), data, batch, gc.data());
    const double lg =
        gpu.LossAndGradient(params.data(), data, batch, gg.data());
    EXPECT_NEAR(lg, lc, 1e-5 * std::max(1.0, std::abs(lc)));
    double diff2 = 0, norm2 = 0;
    int bad = 0;
    for (size_t i = 0; i < gc.size(); ++i) {
      const double d = double(gg[i]) - gc[i];
      diff2 += d * d;
      norm2 += double(gc[i]) * gc[i];
      if (!(std::abs(d) <= 1e-5 + 1e-3 * std::abs(gc[i]))) {
        if (++bad <= 5) {
          ADD_FAILURE() << "grad[" << i << "]: gpu " << gg[i] << " cpu "
                        << gc[i];
        }
      }
    }
    EXPECT_EQ(bad, 0) << "of " << gc.size() << " gradient entries differ";
    EXPECT_LE(std::sqrt(diff2), 5e-5 * std::sqrt(norm2) + 1e-7);
  }

  void CompareEvaluate(const Model& cpu, const Model& gpu,
                       const std::vector<float>& params, const Dataset& data) {
    const auto [acc_c, loss_c] = cpu.Evaluate(params.data(), data);
    const auto [acc_g, loss_g] = gpu.Evaluate(params.data(), data);
    // A near-tie may flip an arg-max.
    EXPECT_NEAR(acc_g, acc_c, 2.0 / std::max(1, data.num_examples));
    EXPECT_NEAR(loss_g, loss_c, 1e-5 * std::max(1.0, std::abs(loss_c)));
  }
};

TEST_F(CudaMlpTest, SameBlocksAndInit) {
  const std::vector<int> sizes = {20, 16, 8, 4};
  auto cpu = MakeMlp(sizes);
  auto gpu = Gpu(sizes, 0);
  ASSERT_NE(gpu, nullptr);
  ASSERT_EQ(gpu->NumParams(), cpu->NumParams());
  const auto bc = cpu->Blocks(), bg = gpu->Blocks();
  ASSERT_EQ(bg.size(), bc.size());
  for (size_t i = 0; i < bc.size(); ++i) {
    EXPECT_EQ(bg[i].name, bc[i].name);
    EXPECT_EQ(bg[i].rows, bc[i].rows);
    EXPECT_EQ(bg[i].width, bc[i].width);
  }
  std::vector<float> pc(cpu->NumParams()), pg(cpu->NumParams());
  cpu->Init(42, pc.data());
  gpu->Init(42, pg.data());
  EXPECT_EQ(pg, pc);
}

TEST_F(CudaMlpTest, MatchesCpuOnRandomData) {
  // Shapes: one layer (softmax regression), two hidden layers, and more
  // classes than a warp has lanes.
  const std::vector<std::vector<int>> shapes = {
      {7, 3}, {7, 5, 3}, {20, 16, 8, 4}, {10, 8, 40}};
  uint64_t seed = 1;
  for (const auto& sizes : shapes) {
    for (float l2 : {0.0f, 0.1f}) {
      SCOPED_TRACE(::testing::Message()
                   << "sizes " << absl::StrJoin(sizes, ",") << " l2 " << l2);
      const Dataset data = RandomData(200, sizes[0], sizes.back(), ++seed);
      auto cpu = MakeMlp(sizes, l2);
      auto gpu = Gpu(sizes, l2);
      ASSERT_NE(gpu, nullptr);
      std::vector<float> params(cpu->NumParams());
      cpu->Init(seed, params.data());
      for (int size : {1, 5, 33, 200}) {
        CompareStep(*cpu, *gpu, params, data,
                    RandomBatch(size, data.num_examples, ++seed));
      }
      CompareEvaluate(*cpu, *gpu, params, data);
    }
  }
}

// The device buffers grow once and are reused for smaller batches.
TEST_F(CudaMlpTest, BatchesGrowAndShrink) {
  const std::vector<int> sizes = {30, 24, 6};
  const Dataset data = RandomData(2000, 30, 6, 7);
  auto cpu = MakeMlp(sizes, 0.01f);
  auto gpu = Gpu(sizes, 0.01f);
  ASSERT_NE(gpu, nullptr);
  std::vector<float> params(cpu->NumParams());
  cpu->Init(3, params.data());
  uint64_t seed = 100;
  for (int size : {300, 17, 1500, 5, 256, 1500, 1}) {
    CompareStep(*cpu, *gpu, params, data,
                RandomBatch(size, data.num_examples, ++seed));
  }
}

TEST_F(CudaMlpTest, ConcurrentCallsAreSerialized) {
  const std::vector<int> sizes = {30, 24, 6};
  const Dataset data = RandomData(500, 30, 6, 8);
  auto gpu = Gpu(sizes, 0);
  ASSERT_NE(gpu, nullptr);
  std::vector<float> params(gpu->NumParams());
  gpu->Init(5, params.data());
  const std::vector<int> small = RandomBatch(40, 500, 1);
  const std::vector<int> large = RandomBatch(400, 500, 2);
  std::vector<float> want_s(params.size()), want_l(params.size());
  const double ls =
      gpu->LossAndGradient(params.data(), data, small, want_s.data());
  const double ll =
      gpu->LossAndGradient(params.data(), data, large, want_l.data());
  auto run = [&](const std::vector<int>& batch, double want_loss,
                 const std::vector<float>& want_grad) {
    std::vector<float> g(params.size());
    for (int i = 0; i < 20; ++i) {
      const double loss =
          gpu->LossAndGradient(params.data(), data, batch, g.data());
      EXPECT_NEAR(loss, want_loss, 1e-6 * std::max(1.0, std::abs(want_loss)));
      for (size_t k = 0; k < g.size(); ++k) {
        ASSERT_NEAR(g[k], want_grad[k], 1e-6 + 1e-5 * std::abs(want_grad[k]))
            << k;
      }
    }
  };
  std::thread a([&] { run(small, ls, want_s); });
  std::thread b([&] { run(large, ll, want_l); });
  a.join();
  b.join();
}

class CudaMlpFashionTest : public CudaMlpTest {
 protected:
  void SetUp() override {
    CudaMlpTest::SetUp();
    if (IsSkipped()) return;
    auto test = LoadFashionMnist(kFashionMnist, /*train=*/false);
    if (!test.ok()) GTEST_SKIP() << "no Fashion-MNIST: " << test.status();
    data_ = std::move(*test);
  }
  Dataset data_;
};

TEST_F(CudaMlpFashionTest, MatchesCpuOnFashionMnist) {
  for (const std::vector<int>& sizes :
       std::vector<std::vector<int>>{{784, 256, 10}, {784, 128, 64, 10}}) {
    SCOPED_TRACE(absl::StrJoin(sizes, ","));
    const float l2 = 1e-4f;
    auto cpu = MakeMlp(sizes, l2);
    auto gpu = Gpu(sizes, l2);
    ASSERT_NE(gpu, nullptr);
    std::vector<float> params(cpu->NumParams());
    cpu->Init(11, params.data());
    for (int size : {64, 1000}) {
      CompareStep(*cpu, *gpu, params, data_,
                  RandomBatch(size, data_.num_examples, size));
    }
    // After a few CPU SGD steps too, so that the logits are not all small.
    std::vector<float> g(params.size());
    for (int step = 0; step < 20; ++step) {
      cpu->LossAndGradient(params.data(), data_,
                           RandomBatch(128, data_.num_examples, 1000 + step),
                           g.data());
      for (size_t k = 0; k < g.size(); ++k) params[k] -= 0.1f * g[k];
    }
    CompareStep(*cpu, *gpu, params, data_,
                RandomBatch(256, data_.num_examples, 77));
    CompareEvaluate(*cpu, *gpu, params, data_);
  }
}

}  // namespace
}  // namespace downpour
