#include "models/model.h"

#include <Eigen/Dense>
#include <cmath>
#include <random>

#include "absl/strings/str_cat.h"

namespace downpour {
namespace {

using Mat = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
using Row = Eigen::Matrix<float, 1, Eigen::Dynamic>;
using ConstMap = Eigen::Map<const Mat>;
using ConstRow = Eigen::Map<const Row>;
using MutMap = Eigen::Map<Mat>;
using MutRow = Eigen::Map<Row>;

// A softmax classifier after zero or more ReLU layers. Softmax regression is
// the case with no hidden layer.
class Mlp final : public Model {
 public:
  Mlp(std::vector<int> sizes, float l2, std::string prefix, bool zero_init)
      : sizes_(std::move(sizes)), l2_(l2), prefix_(std::move(prefix)),
        zero_init_(zero_init) {
    for (size_t l = 0; l + 1 < sizes_.size(); ++l) {
      const std::string suffix = sizes_.size() == 2 ? "" : absl::StrCat(l);
      blocks_.push_back({absl::StrCat(prefix_, "/W", suffix), size_t(sizes_[l]),
                         size_t(sizes_[l + 1])});
      blocks_.push_back({absl::StrCat(prefix_, "/b", suffix), 1, size_t(sizes_[l + 1])});
    }
    for (const auto& b : blocks_) num_params_ += b.rows * b.width;
  }

  std::vector<ParamBlock> Blocks() const override { return blocks_; }
  size_t NumParams() const override { return num_params_; }

  void Init(uint64_t seed, float* params) const override {
    std::mt19937_64 rng(seed);
    size_t off = 0;
    for (size_t l = 0; l + 1 < sizes_.size(); ++l) {
      const size_t w = size_t(sizes_[l]) * sizes_[l + 1];
      std::normal_distribution<double> normal(0.0, std::sqrt(2.0 / sizes_[l]));
      for (size_t i = 0; i < w; ++i) {
        params[off + i] = zero_init_ ? 0.0f : static_cast<float>(normal(rng));
      }
      off += w;
      for (int i = 0; i < sizes_[l + 1]; ++i) params[off + i] = 0.0f;
      off += sizes_[l + 1];
    }
  }

  double LossAndGradient(const float* params, const Dataset& data,
                         const std::vector<int>& batch,
                         float* grad) const override {
    const int n = static_cast<int>(batch.size());
    Mat x(n, sizes_[0]);
    for (int i = 0; i < n; ++i) {
      x.row(i) = ConstRow(data.features.data() + size_t(batch[i]) * data.dim, data.dim);
    }
    std::vector<Mat> acts = Forward(params, x);
    Mat& probs = acts.back();
    double loss = 0;
    for (int i = 0; i < n; ++i) {
      const int y = data.labels[batch[i]];
      loss -= std::log(std::max(probs(i, y), 1e-30f));
      probs(i, y) -= 1.0f;
    }
    loss /= n;
    Mat delta = probs / static_cast<float>(n);  // d loss / d logits
    // Offsets of each layer's W and b.
    std::vector<size_t> offs;
    size_t off = 0;
    for (size_t l = 0; l + 1 < sizes_.size(); ++l) {
      offs.push_back(off);
      off += size_t(sizes_[l]) * sizes_[l + 1] + sizes_[l + 1];
    }
    for (int l = static_cast<int>(sizes_.size()) - 2; l >= 0; --l) {
      const int in = sizes_[l], out = sizes_[l + 1];
      const Mat& input = acts[l];
      MutMap gw(grad + offs[l], in, out);
      MutRow gb(grad + offs[l] + size_t(in) * out, out);
      gw.noalias() = input.transpose() * delta;
      gb = delta.colwise().sum();
      ConstMap w(params + offs[l], in, out);
      if (l2_ > 0) {
        gw += l2_ * w;
        loss += 0.5 * l2_ * w.squaredNorm();
      }
      if (l > 0) {
        Mat next = delta * w.transpose();
        // ReLU derivative: the activation was positive.
        next = next.cwiseProduct(
            (acts[l].array() > 0.0f).cast<float>().matrix());
        delta = std::move(next);
      }
    }
    return loss;
  }

  std::pair<double, double> Evaluate(const float* params,
                                     const Dataset& data) const override {
    constexpr int kChunk = 1000;
    int correct = 0;
    double loss = 0;
    for (int start = 0; start < data.num_examples; start += kChunk) {
      const int n = std::min(kChunk, data.num_examples - start);
      ConstMap x(data.features.data() + size_t(start) * data.dim, n, data.dim);
      std::vector<Mat> acts = Forward(params, x);
      const Mat& p = acts.back();
      for (int i = 0; i < n; ++i) {
        Eigen::Index arg;
        p.row(i).maxCoeff(&arg);
        const int y = data.labels[start + i];
        correct += arg == y;
        loss -= std::log(std::max(p(i, y), 1e-30f));
      }
    }
    return {static_cast<double>(correct) / data.num_examples,
            loss / data.num_examples};
  }

 private:
  // Activations: input, hidden layers (after ReLU), output probabilities.
  template <typename Input>
  std::vector<Mat> Forward(const float* params, const Input& x) const {
    std::vector<Mat> acts;
    acts.emplace_back(x);
    size_t off = 0;
    for (size_t l = 0; l + 1 < sizes_.size(); ++l) {
      const int in = sizes_[l], out = sizes_[l + 1];
      ConstMap w(params + off, in, out);
      ConstRow b(params + off + size_t(in) * out, out);
      off += size_t(in) * out + out;
      Mat z = acts.back() * w;
      z.rowwise() += b;
      if (l + 2 < sizes_.size()) {
        z = z.cwiseMax(0.0f);
      } else {
        // Row-wise softmax, shifted by the row maximum for stability.
        for (Eigen::Index i = 0; i < z.rows(); ++i) {
          const float m = z.row(i).maxCoeff();
          z.row(i) = (z.row(i).array() - m).exp().matrix();
          z.row(i) /= z.row(i).sum();
        }
      }
      acts.push_back(std::move(z));
    }
    return acts;
  }

  const std::vector<int> sizes_;
  const float l2_;
  const std::string prefix_;
  const bool zero_init_;
  std::vector<ParamBlock> blocks_;
  size_t num_params_ = 0;
};

}  // namespace

std::unique_ptr<Model> MakeSoftmaxRegression(int dim, int classes, float l2) {
  return std::make_unique<Mlp>(std::vector<int>{dim, classes}, l2, "softmax",
                               /*zero_init=*/true);
}

std::unique_ptr<Model> MakeMlp(std::vector<int> layer_sizes, float l2) {
  return std::make_unique<Mlp>(std::move(layer_sizes), l2, "mlp",
                               /*zero_init=*/false);
}

}  // namespace downpour
