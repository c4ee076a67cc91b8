#include "models/model.h"

#include <cmath>
#include <random>

#include "common/test_util.h"

namespace downpour {
namespace {

Dataset RandomData(int n, int dim, int classes, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> u(0, 1);
  Dataset d;
  d.num_examples = n;
  d.dim = dim;
  d.num_classes = classes;
  for (int i = 0; i < n * dim; ++i) d.features.push_back(u(rng));
  for (int i = 0; i < n; ++i) d.labels.push_back(static_cast<int>(rng() % classes));
  return d;
}

// Central finite differences against the analytic gradient.
void CheckGradient(const Model& m, uint64_t seed) {
  Dataset d = RandomData(8, 6, 4, seed);
  std::vector<float> p(m.NumParams());
  m.Init(seed, p.data());
  std::mt19937_64 rng(seed);
  for (float& v : p) v += std::normal_distribution<float>(0, 0.3f)(rng);
  std::vector<int> batch = {0, 1, 2, 3, 4, 5, 6, 7};
  std::vector<float> g(p.size()), scratch(p.size());
  m.LossAndGradient(p.data(), d, batch, g.data());
  double max_rel = 0;
  for (size_t i = 0; i < p.size(); ++i) {
    const float h = 1e-3f, orig = p[i];
    p[i] = orig + h;
    const double up = m.LossAndGradient(p.data(), d, batch, scratch.data());
    p[i] = orig - h;
    const double down = m.LossAndGradient(p.data(), d, batch, scratch.data());
    p[i] = orig;
    const double numeric = (up - down) / (2 * h);
    max_rel = std::max(max_rel, std::abs(numeric - g[i]) / std::max(1e-2, std::abs(numeric)));
  }
  EXPECT_LT(max_rel, 2e-2);
}

TEST(ModelTest, SoftmaxGradientMatchesFiniteDifferences) {
  CheckGradient(*MakeSoftmaxRegression(6, 4, 0.1f), 1);
}

TEST(ModelTest, MlpGradientMatchesFiniteDifferences) {
  CheckGradient(*MakeMlp({6, 5, 4}), 2);
  CheckGradient(*MakeMlp({6, 5, 3, 4}, 0.01f), 3);
}

TEST(ModelTest, BlocksDescribeTheParameters) {
  auto m = MakeMlp({784, 256, 10});
  size_t total = 0;
  for (const auto& b : m->Blocks()) total += b.rows * b.width;
  EXPECT_EQ(total, m->NumParams());
  EXPECT_EQ(m->Blocks().size(), 4u);
  EXPECT_EQ(m->Blocks()[0].name, "mlp/W0");
  auto s = MakeSoftmaxRegression(784, 10);
  EXPECT_EQ(s->Blocks()[0].name, "softmax/W");
  EXPECT_EQ(s->NumParams(), 7850u);
}

TEST(DatasetTest, LoadsFashionMnistAndRejectsCorruptFiles) {
  auto train = LoadFashionMnist("/usr/share/datasets/fashion-mnist", true);
  ASSERT_OK(train);
  EXPECT_EQ(train->num_examples, 60000);
  EXPECT_EQ(train->dim, 784);
  auto test = LoadFashionMnist("/usr/share/datasets/fashion-mnist", false);
  ASSERT_OK(test);
  EXPECT_EQ(test->num_examples, 10000);
  float lo = 1, hi = 0;
  for (float v : test->features) {
    lo = std::min(lo, v);
    hi = std::max(hi, v);
  }
  EXPECT_EQ(lo, 0.0f);
  EXPECT_EQ(hi, 1.0f);
  Dataset shard = Shard(*test, 1, 3);
  EXPECT_EQ(shard.num_examples, 3333);
  EXPECT_EQ(shard.labels[0], test->labels[1]);

  EXPECT_THAT(LoadFashionMnist("/nonexistent", true), StatusIs(absl::StatusCode::kNotFound));
  // A truncated copy of the test set.
  const std::string dir = TestTmpDir() + "/corrupt";
  ASSERT_EQ(system(("mkdir -p " + dir + " && cp /usr/share/datasets/fashion-mnist/t10k-labels-idx1-ubyte.gz " + dir +
                    " && gzip -dc /usr/share/datasets/fashion-mnist/t10k-images-idx3-ubyte.gz | head -c 100000 | gzip > " +
                    dir + "/t10k-images-idx3-ubyte.gz").c_str()),
            0);
  EXPECT_THAT(LoadFashionMnist(dir, false), StatusIs(absl::StatusCode::kDataLoss));
}

TEST(ModelTest, SoftmaxLearnsFashionMnist) {
  auto train = LoadFashionMnist("/usr/share/datasets/fashion-mnist", true);
  auto test = LoadFashionMnist("/usr/share/datasets/fashion-mnist", false);
  ASSERT_OK(train);
  ASSERT_OK(test);
  auto m = MakeSoftmaxRegression(784, 10);
  std::vector<float> p(m->NumParams()), g(p.size());
  m->Init(0, p.data());
  std::mt19937 rng(5);
  for (int step = 0; step < 1500; ++step) {
    std::vector<int> batch(64);
    for (int& b : batch) b = static_cast<int>(rng() % train->num_examples);
    m->LossAndGradient(p.data(), *train, batch, g.data());
    for (size_t i = 0; i < p.size(); ++i) p[i] -= 0.3f * g[i];
  }
  auto [acc, loss] = m->Evaluate(p.data(), *test);
  EXPECT_GT(acc, 0.78);
  EXPECT_LT(loss, 0.7);
}

}  // namespace
}  // namespace downpour
