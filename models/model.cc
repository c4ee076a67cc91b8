#include "models/model.h"

#include <algorithm>
#include <cmath>
#include <functional>

#include "common/logging.h"
#include "models/internal/dense_net.h"

namespace downpour {
namespace {

using models_internal::DenseNet;

// The float instantiation of the shared dense math behind the interface.
class DenseModel final : public Model {
 public:
  explicit DenseModel(DenseNet<float> net) : net_(std::move(net)) {}

  std::vector<ParamBlock> Blocks() const override { return net_.Blocks(); }
  size_t NumParams() const override { return net_.NumParams(); }
  void Init(uint64_t seed, float* params) const override {
    net_.Init(seed, params);
  }
  double LossAndGradient(const float* params, const Dataset& data,
                         const std::vector<int>& batch,
                         float* grad) const override {
    return net_.LossAndGradient(params, data, batch, grad);
  }
  double LossAndGradientStreamed(const float* params, const Dataset& data,
                                 const std::vector<int>& batch, float* grad,
                                 const GradientReady& ready) const override {
    return net_.LossAndGradient(params, data, batch, grad, &ready);
  }
  std::pair<double, double> Evaluate(const float* params,
                                     const Dataset& data) const override {
    return net_.Evaluate(params, data);
  }

 private:
  const DenseNet<float> net_;
};

// log(1 + exp(z)) without overflow for large z or loss of precision for
// very negative z.
double Softplus(double z) {
  return std::max(z, 0.0) + std::log1p(std::exp(-std::abs(z)));
}

}  // namespace

std::unique_ptr<Model> MakeSoftmaxRegression(int dim, int classes, float l2,
                                             int threads) {
  return std::make_unique<DenseModel>(
      DenseNet<float>("softmax", /*numbered=*/false, {dim, classes}, l2,
                      threads, /*zero_init=*/true));
}

std::unique_ptr<Model> MakeMlp(std::vector<int> layer_sizes, float l2,
                               int threads) {
  return std::make_unique<DenseModel>(
      DenseNet<float>("mlp", /*numbered=*/true, std::move(layer_sizes), l2,
                      threads, /*zero_init=*/false));
}

std::vector<uint64_t> BatchFeatureIds(const SparseDataset& data, size_t begin,
                                      size_t end) {
  DP_CHECK(begin <= end && end <= data.NumRows())
      << "rows [" << begin << ", " << end << ") of " << data.NumRows();
  std::vector<uint64_t> ids(data.feature_ids.begin() + data.row_offsets[begin],
                            data.feature_ids.begin() + data.row_offsets[end]);
  std::sort(ids.begin(), ids.end());
  ids.erase(std::unique(ids.begin(), ids.end()), ids.end());
  return ids;
}

double SparseLogRegLossAndGradient(const SparseDataset& data, size_t begin,
                                   size_t end, absl::Span<const uint64_t> ids,
                                   absl::Span<const float> weights,
                                   absl::Span<float> grad, float l2) {
  DP_CHECK(begin <= end && end <= data.NumRows())
      << "rows [" << begin << ", " << end << ") of " << data.NumRows();
  DP_CHECK(weights.size() == ids.size() && grad.size() == ids.size())
      << ids.size() << " ids, " << weights.size() << " weights, " << grad.size()
      << " gradients";
  DP_CHECK(std::adjacent_find(ids.begin(), ids.end(),
                              std::greater_equal<uint64_t>()) == ids.end())
      << "ids not sorted and distinct";
  // Accumulated in double: a hot feature collects thousands of terms.
  std::vector<double> acc(ids.size(), 0.0);
  std::vector<size_t> slot;  // position in `ids` of each feature of a row
  double loss = 0;
  for (size_t r = begin; r < end; ++r) {
    const size_t f0 = data.row_offsets[r], f1 = data.row_offsets[r + 1];
    slot.resize(f1 - f0);
    double z = 0;
    for (size_t f = f0; f < f1; ++f) {
      const auto it =
          std::lower_bound(ids.begin(), ids.end(), data.feature_ids[f]);
      DP_CHECK(it != ids.end() && *it == data.feature_ids[f])
          << "feature id " << data.feature_ids[f] << " of row " << r
          << " is not among the ids given";
      slot[f - f0] = it - ids.begin();
      z += static_cast<double>(weights[slot[f - f0]]) * data.feature_values[f];
    }
    const double y = data.labels[r];
    // -[y log p + (1 - y) log(1 - p)] with p = sigmoid(z).
    loss += Softplus(z) - y * z;
    const double dz = 1.0 / (1.0 + std::exp(-z)) - y;
    for (size_t f = f0; f < f1; ++f)
      acc[slot[f - f0]] += dz * data.feature_values[f];
  }
  const double scale =
      end > begin ? 1.0 / static_cast<double>(end - begin) : 0.0;
  loss *= scale;
  for (size_t i = 0; i < ids.size(); ++i) {
    const double w = weights[i];
    grad[i] = static_cast<float>(acc[i] * scale + l2 * w);
    loss += 0.5 * l2 * w * w;
  }
  return loss;
}

}  // namespace downpour
