#include "models/model.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>

#include "common/test_util.h"
#include "models/internal/dense_net.h"
#include "models/internal/parallel.h"

namespace downpour {
namespace {

using models_internal::DenseNet;

Dataset RandomData(int n, int dim, int classes, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> u(0, 1);
  Dataset d;
  d.num_examples = n;
  d.dim = dim;
  d.num_classes = classes;
  for (int i = 0; i < n * dim; ++i) d.features.push_back(u(rng));
  for (int i = 0; i < n; ++i)
    d.labels.push_back(static_cast<int>(rng() % classes));
  return d;
}

std::vector<int> AllRows(const Dataset& d) {
  std::vector<int> rows(d.num_examples);
  for (int i = 0; i < d.num_examples; ++i) rows[i] = i;
  return rows;
}

// Largest |a - b| / max(|a|, |b|, floor) over the coordinates. The floor
// keeps coordinates whose gradient is nearly zero from dividing rounding
// noise by nearly zero.
double MaxRelativeError(const std::vector<double>& a,
                        const std::vector<double>& b, double floor = 1e-4) {
  double worst = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    const double scale = std::max({std::abs(a[i]), std::abs(b[i]), floor});
    worst = std::max(worst, std::abs(a[i] - b[i]) / scale);
  }
  return worst;
}

// Central finite differences of the loss, in double.
std::vector<double> NumericGradient(const DenseNet<double>& net,
                                    std::vector<double> params,
                                    const Dataset& data,
                                    const std::vector<int>& batch) {
  std::vector<double> numeric(params.size()), scratch(params.size());
  const double h = 1e-6;
  for (size_t i = 0; i < params.size(); ++i) {
    const double orig = params[i];
    params[i] = orig + h;
    const double up =
        net.LossAndGradient(params.data(), data, batch, scratch.data());
    params[i] = orig - h;
    const double down =
        net.LossAndGradient(params.data(), data, batch, scratch.data());
    params[i] = orig;
    numeric[i] = (up - down) / (2 * h);
  }
  return numeric;
}

// Random (not initial) parameters, so that no gradient is zero by symmetry
// and the softmax is not uniform.
std::vector<double> RandomParams(const DenseNet<double>& net, uint64_t seed) {
  std::vector<double> p(net.NumParams());
  net.Init(seed, p.data());
  std::mt19937_64 rng(seed + 1);
  std::normal_distribution<double> normal(0, 0.5);
  for (double& v : p) v += normal(rng);
  return p;
}

double GradientCheckError(const DenseNet<double>& net, const Dataset& data,
                          uint64_t seed) {
  const std::vector<double> p = RandomParams(net, seed);
  std::vector<double> analytic(p.size());
  // A batch with a repeat and out of order: indices, not a range.
  std::vector<int> batch = AllRows(data);
  std::reverse(batch.begin(), batch.end());
  batch.push_back(2);
  net.LossAndGradient(p.data(), data, batch, analytic.data());
  return MaxRelativeError(analytic, NumericGradient(net, p, data, batch));
}

TEST(GradientCheck, SoftmaxMatchesFiniteDifferencesInDouble) {
  const Dataset d = RandomData(9, 7, 4, 1);
  for (double l2 : {0.0, 0.3}) {
    DenseNet<double> net("softmax", false, {7, 4}, l2, 1, true);
    EXPECT_LT(GradientCheckError(net, d, 11), 1e-3) << "l2 " << l2;
  }
}

TEST(GradientCheck, MlpMatchesFiniteDifferencesInDouble) {
  const Dataset d = RandomData(9, 7, 4, 2);
  DenseNet<double> one_hidden("mlp", true, {7, 6, 4}, 0.0, 1, false);
  EXPECT_LT(GradientCheckError(one_hidden, d, 12), 1e-3);
  DenseNet<double> two_hidden("mlp", true, {7, 6, 5, 4}, 0.05, 1, false);
  EXPECT_LT(GradientCheckError(two_hidden, d, 13), 1e-3);
}

// The check above must be able to fail: a gradient off by 1% in one
// coordinate is caught.
TEST(GradientCheck, DetectsAWrongGradient) {
  const Dataset d = RandomData(9, 7, 4, 3);
  DenseNet<double> net("mlp", true, {7, 6, 4}, 0.0, 1, false);
  const std::vector<double> p = RandomParams(net, 14);
  std::vector<double> analytic(p.size());
  net.LossAndGradient(p.data(), d, AllRows(d), analytic.data());
  std::vector<double> numeric = NumericGradient(net, p, d, AllRows(d));
  ASSERT_LT(MaxRelativeError(analytic, numeric), 1e-3);
  size_t biggest = 0;
  for (size_t i = 0; i < analytic.size(); ++i) {
    if (std::abs(analytic[i]) > std::abs(analytic[biggest])) biggest = i;
  }
  analytic[biggest] *= 1.01;
  EXPECT_GT(MaxRelativeError(analytic, numeric), 5e-3);
}

// The float models the workers use compute the same gradient as the
// double-checked math, within float rounding.
TEST(FloatModel, AgreesWithDoubleMath) {
  const Dataset d = RandomData(20, 12, 5, 4);
  struct Case {
    std::unique_ptr<Model> model;
    DenseNet<double> reference;
  };
  std::vector<Case> cases;
  cases.push_back({MakeSoftmaxRegression(12, 5, 0.1f),
                   DenseNet<double>("softmax", false, {12, 5}, 0.1, 1, true)});
  cases.push_back(
      {MakeMlp({12, 8, 6, 5}, 0.01f),
       DenseNet<double>("mlp", true, {12, 8, 6, 5}, 0.01, 1, false)});
  for (const Case& c : cases) {
    ASSERT_EQ(c.model->NumParams(), c.reference.NumParams());
    const std::vector<double> pd = RandomParams(c.reference, 21);
    const std::vector<float> pf(pd.begin(), pd.end());
    std::vector<float> gf(pf.size(), 123.0f);  // must be overwritten
    std::vector<double> gd(pd.size());
    const double lf =
        c.model->LossAndGradient(pf.data(), d, AllRows(d), gf.data());
    const double ld =
        c.reference.LossAndGradient(pd.data(), d, AllRows(d), gd.data());
    EXPECT_NEAR(lf, ld, 1e-5 * std::abs(ld));
    EXPECT_LT(MaxRelativeError(std::vector<double>(gf.begin(), gf.end()), gd),
              1e-3);
    auto [acc_f, loss_f] = c.model->Evaluate(pf.data(), d);
    auto [acc_d, loss_d] = c.reference.Evaluate(pd.data(), d);
    EXPECT_EQ(acc_f, acc_d);
    EXPECT_NEAR(loss_f, loss_d, 1e-5 * loss_d);
  }
}

// Splitting the batch between threads changes only the rounding; the
// problem is big enough that two threads really split it.
TEST(FloatModel, ThreadsAgreeWithOneThread) {
  const Dataset d = RandomData(600, 100, 10, 5);
  std::vector<int> batch;
  for (int i = 0; i < 512; ++i) batch.push_back((i * 7) % d.num_examples);
  auto one = MakeMlp({100, 64, 10}, 0.0f, 1);
  auto two = MakeMlp({100, 64, 10}, 0.0f, 2);
  ASSERT_EQ(models_internal::NumParts(2, 512, 6.0 * one->NumParams()), 2);
  ASSERT_EQ(models_internal::NumParts(2, 600, 2.0 * one->NumParams()), 2);
  std::vector<float> p(one->NumParams());
  one->Init(3, p.data());
  std::vector<float> g1(p.size()), g2(p.size()), g2b(p.size());
  const double l1 = one->LossAndGradient(p.data(), d, batch, g1.data());
  const double l2 = two->LossAndGradient(p.data(), d, batch, g2.data());
  EXPECT_NEAR(l1, l2, 1e-5 * l1);
  EXPECT_LT(MaxRelativeError(std::vector<double>(g1.begin(), g1.end()),
                             std::vector<double>(g2.begin(), g2.end())),
            1e-3);
  // Deterministic for a given thread count.
  EXPECT_EQ(two->LossAndGradient(p.data(), d, batch, g2b.data()), l2);
  EXPECT_EQ(g2, g2b);
  auto [acc1, eloss1] = one->Evaluate(p.data(), d);
  auto [acc2, eloss2] = two->Evaluate(p.data(), d);
  EXPECT_EQ(acc1, acc2);
  EXPECT_NEAR(eloss1, eloss2, 1e-5 * eloss1);
}

// The streamed gradient: every float reported exactly once, in whole rows
// of one block, the large first layer in several ranges before the end;
// values and loss bit-for-bit those of LossAndGradient; and no parameter
// of a reported range is read again (overwriting them with NaN, as a
// PushPull reply would overwrite them with new values, changes nothing).
TEST(FloatModel, StreamedGradientIsExactAndReleasesReportedRanges) {
  const Dataset d = RandomData(300, 784, 10, 8);
  std::vector<int> batch;
  for (int i = 0; i < 64; ++i) batch.push_back((i * 11) % d.num_examples);
  for (int threads : {1, 2}) {
    for (float l2 : {0.0f, 1e-3f}) {
      auto m = MakeMlp({784, 256, 10}, l2, threads);
      std::vector<float> p(m->NumParams());
      m->Init(5, p.data());
      std::vector<float> want(p.size()), got(p.size(), -7.0f);
      const double want_loss =
          m->LossAndGradient(p.data(), d, batch, want.data());
      std::vector<int> seen(p.size(), 0);
      std::vector<float> mutable_p = p;
      const std::vector<ParamBlock> blocks = m->Blocks();
      int ranges = 0;
      const double loss = m->LossAndGradientStreamed(
          mutable_p.data(), d, batch, got.data(), [&](size_t off, size_t n) {
            ++ranges;
            // Inside one block, whole rows.
            size_t begin = 0;
            bool inside = false;
            for (const ParamBlock& b : blocks) {
              const size_t size = b.rows * b.width;
              if (off >= begin && off + n <= begin + size) {
                inside = (off - begin) % b.width == 0 && n % b.width == 0;
              }
              begin += size;
            }
            EXPECT_TRUE(inside) << off << " + " << n;
            for (size_t i = off; i < off + n; ++i) {
              ++seen[i];
              mutable_p[i] = std::nanf("");
            }
          });
      EXPECT_EQ(loss, want_loss) << threads << " threads, l2 " << l2;
      EXPECT_EQ(std::memcmp(got.data(), want.data(), want.size() * 4), 0)
          << threads << " threads, l2 " << l2;
      EXPECT_EQ(std::count(seen.begin(), seen.end(), 1),
                static_cast<long>(seen.size()));
      // One thread streams the 784 x 256 weights in row ranges.
      if (threads == 1) {
        EXPECT_GT(ranges, 4);
      }
    }
  }
}

TEST(FloatModel, ExtremeLogitsGiveFiniteLossAndGradient) {
  Dataset d = RandomData(4, 3, 3, 6);
  auto m = MakeSoftmaxRegression(3, 3);
  std::vector<float> p(m->NumParams(), 0.0f), g(p.size());
  // Bias logits of +-1e4: a naive softmax overflows exp() or takes log(0).
  p[9] = 1e4f;
  p[10] = -1e4f;
  d.labels = {1, 1, 0, 2};
  const double loss = m->LossAndGradient(p.data(), d, AllRows(d), g.data());
  EXPECT_TRUE(std::isfinite(loss));
  EXPECT_NEAR(loss, (2e4 + 2e4 + 0 + 1e4) / 4, 1.0);
  for (float v : g) EXPECT_TRUE(std::isfinite(v));
}

TEST(Blocks, DescribeTheParameters) {
  auto mlp = MakeMlp({784, 256, 10});
  const std::vector<ParamBlock> b = mlp->Blocks();
  ASSERT_EQ(b.size(), 4u);
  EXPECT_EQ(b[0].name, "mlp/W0");
  EXPECT_EQ(b[0].rows, 784u);
  EXPECT_EQ(b[0].width, 256u);
  EXPECT_EQ(b[1].name, "mlp/b0");
  EXPECT_EQ(b[1].rows, 1u);
  EXPECT_EQ(b[1].width, 256u);
  EXPECT_EQ(b[3].name, "mlp/b1");
  size_t total = 0;
  for (const ParamBlock& block : b) total += block.rows * block.width;
  EXPECT_EQ(total, mlp->NumParams());
  EXPECT_EQ(mlp->NumParams(), 784u * 256 + 256 + 256 * 10 + 10);

  auto softmax = MakeSoftmaxRegression(784, 10);
  ASSERT_EQ(softmax->Blocks().size(), 2u);
  EXPECT_EQ(softmax->Blocks()[0].name, "softmax/W");
  EXPECT_EQ(softmax->Blocks()[1].name, "softmax/b");
  EXPECT_EQ(softmax->NumParams(), 7850u);
}

TEST(Init, DeterministicAndScaled) {
  auto softmax = MakeSoftmaxRegression(20, 3);
  std::vector<float> s(softmax->NumParams(), 1.0f);
  softmax->Init(7, s.data());
  for (float v : s) EXPECT_EQ(v, 0.0f);

  auto mlp = MakeMlp({200, 100, 10});
  std::vector<float> a(mlp->NumParams()), b(a.size()), c(a.size());
  mlp->Init(7, a.data());
  mlp->Init(7, b.data());
  mlp->Init(8, c.data());
  EXPECT_EQ(a, b);
  EXPECT_NE(a, c);
  // He init: W0 entries have variance 2 / 200; biases are zero.
  double sq = 0;
  for (int i = 0; i < 200 * 100; ++i) sq += a[i] * a[i];
  EXPECT_NEAR(sq / (200 * 100), 2.0 / 200, 0.1 * 2.0 / 200);
  for (int i = 200 * 100; i < 200 * 100 + 100; ++i) EXPECT_EQ(a[i], 0.0f);
}

TEST(Evaluate, CountsCorrectPredictions) {
  // Softmax on 2-d inputs whose W is the identity: predicts argmax(x).
  Dataset d;
  d.num_examples = 4;
  d.dim = 2;
  d.num_classes = 2;
  d.features = {1, 0, 0, 1, 0.2f, 0.9f, 0.7f, 0.1f};
  d.labels = {0, 1, 0, 0};  // the third is wrong
  auto m = MakeSoftmaxRegression(2, 2);
  std::vector<float> p = {1, 0, 0, 1, 0, 0};
  auto [acc, loss] = m->Evaluate(p.data(), d);
  EXPECT_DOUBLE_EQ(acc, 0.75);
  double expected = 0;
  const double z[4][2] = {{1, 0}, {0, 1}, {0.2, 0.9}, {0.7, 0.1}};
  for (int i = 0; i < 4; ++i) {
    expected +=
        std::log(std::exp(z[i][0]) + std::exp(z[i][1])) - z[i][d.labels[i]];
  }
  EXPECT_NEAR(loss, expected / 4, 1e-6);
  EXPECT_EQ(m->Evaluate(p.data(), Dataset{0, 2, 2, {}, {}}),
            std::make_pair(0.0, 0.0));
}

TEST(ModelDeathTest, RejectsBadBatchIndex) {
  const Dataset d = RandomData(4, 3, 3, 7);
  auto m = MakeSoftmaxRegression(3, 3);
  std::vector<float> p(m->NumParams()), g(p.size());
  EXPECT_DEATH(m->LossAndGradient(p.data(), d, {0, 4}, g.data()),
               "batch index 4");
  EXPECT_DEATH(m->LossAndGradient(p.data(), d, {}, g.data()), "empty batch");
  auto wrong_dim = MakeSoftmaxRegression(5, 3);
  EXPECT_DEATH(wrong_dim->LossAndGradient(p.data(), d, {0}, g.data()),
               "data dim");
}

}  // namespace
}  // namespace downpour
