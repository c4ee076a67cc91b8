#include "lbfgs/problem.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <numeric>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "models/dataset.h"
#include "models/model.h"

namespace downpour {
namespace {

// Scales a mean over `count` examples into a share of the mean over `total`.
void ScaleInto(double share, absl::Span<float> grad) {
  for (float& g : grad) g = static_cast<float>(g * share);
}

class SoftmaxProblem final : public TaskProblem {
 public:
  SoftmaxProblem(Dataset train, Dataset test)
      : train_(std::move(train)),
        test_(std::move(test)),
        model_(MakeSoftmaxRegression(train_.dim, train_.num_classes, 0.0f, 1)) {
  }

  uint64_t num_examples() const override { return train_.num_examples; }
  // Key k < dim: the weights of input k for every class; key dim: biases.
  uint64_t num_keys() const override { return train_.dim + 1; }
  uint32_t width() const override { return train_.num_classes; }
  uint64_t RegularizedKeys() const override { return train_.dim; }
  std::vector<Key> TaskKeys(uint64_t, uint64_t) const override { return {}; }

  double Compute(uint64_t begin, uint64_t end, absl::Span<const float> x,
                 absl::Span<float> grad) const override {
    std::vector<int> batch(end - begin);
    std::iota(batch.begin(), batch.end(), static_cast<int>(begin));
    const double mean =
        model_->LossAndGradient(x.data(), train_, batch, grad.data());
    const double share = static_cast<double>(end - begin) / num_examples();
    ScaleInto(share, grad);
    return mean * share;
  }

  absl::StatusOr<std::pair<double, double>> Evaluate(
      absl::Span<const float> x) const override {
    return model_->Evaluate(x.data(), test_);
  }

 private:
  const Dataset train_;
  const Dataset test_;
  const std::unique_ptr<Model> model_;
};

class SparseLrProblem final : public TaskProblem {
 public:
  SparseLrProblem(SparseDataset data, size_t train_rows, uint64_t features)
      : data_(std::move(data)), train_rows_(train_rows), features_(features) {}

  uint64_t num_examples() const override { return train_rows_; }
  uint64_t num_keys() const override { return features_; }
  uint32_t width() const override { return 1; }
  uint64_t RegularizedKeys() const override { return features_; }
  std::vector<Key> TaskKeys(uint64_t begin, uint64_t end) const override {
    return BatchFeatureIds(data_, begin, end);
  }

  double Compute(uint64_t begin, uint64_t end, absl::Span<const float> x,
                 absl::Span<float> grad) const override {
    const std::vector<Key> ids = TaskKeys(begin, end);
    const double mean =
        SparseLogRegLossAndGradient(data_, begin, end, ids, x, grad, 0.0f);
    const double share = static_cast<double>(end - begin) / num_examples();
    ScaleInto(share, grad);
    return mean * share;
  }

  absl::StatusOr<std::pair<double, double>> Evaluate(
      absl::Span<const float> x) const override {
    if (train_rows_ == data_.NumRows()) {
      return absl::FailedPreconditionError("no held-out rows");
    }
    double loss = 0;
    size_t correct = 0;
    for (size_t r = train_rows_; r < data_.NumRows(); ++r) {
      double z = 0;
      for (size_t i = data_.row_offsets[r]; i < data_.row_offsets[r + 1]; ++i) {
        const uint64_t id = data_.feature_ids[i];
        if (id < features_)
          z += static_cast<double>(x[id]) * data_.feature_values[i];
      }
      const double y = data_.labels[r];
      // log(1 + e^-|z|) + max(z, 0) - y z: stable for any z.
      loss += std::log1p(std::exp(-std::abs(z))) + std::max(z, 0.0) - y * z;
      correct += (z > 0) == (y > 0.5);
    }
    const double n = static_cast<double>(data_.NumRows() - train_rows_);
    return std::make_pair(correct / n, loss / n);
  }

 private:
  const SparseDataset data_;
  const size_t train_rows_;
  const uint64_t features_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<TaskProblem>> TaskProblem::Load(
    const proto::SandblasterProblem& spec) {
  if (spec.kind() == "softmax") {
    DP_ASSIGN_OR_RETURN(Dataset train,
                        LoadFashionMnist(spec.data_path(), true));
    DP_ASSIGN_OR_RETURN(Dataset test,
                        LoadFashionMnist(spec.data_path(), false));
    return std::unique_ptr<TaskProblem>(
        new SoftmaxProblem(std::move(train), std::move(test)));
  }
  if (spec.kind() == "sparse_lr") {
    if (spec.data_path().empty()) {
      const uint64_t features =
          spec.num_features() ? spec.num_features() : 1 << 18;
      const size_t rows = spec.generate_rows() ? spec.generate_rows() : 100000;
      SparseDataset data =
          GenerateClickData(rows, 20, features, 1.1, spec.seed());
      const size_t train = rows - rows / 10;
      return std::unique_ptr<TaskProblem>(
          new SparseLrProblem(std::move(data), train, features));
    }
    std::ifstream in(spec.data_path());
    if (!in) {
      return absl::NotFoundError(
          absl::StrCat("cannot open libsvm file '", spec.data_path(), "'"));
    }
    DP_ASSIGN_OR_RETURN(SparseDataset data, ParseLibsvm(in), "libsvm file '",
                        spec.data_path(), "'");
    if (data.NumRows() == 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("libsvm file '", spec.data_path(), "' has no rows"));
    }
    uint64_t features = 0;
    for (uint64_t id : data.feature_ids) features = std::max(features, id + 1);
    if (spec.num_features() != 0) {
      if (features > spec.num_features()) {
        return absl::InvalidArgumentError(absl::StrCat(
            "libsvm file '", spec.data_path(), "' has feature id ",
            features - 1, " but num_features is ", spec.num_features()));
      }
      features = spec.num_features();
    }
    const size_t rows = data.NumRows();
    return std::unique_ptr<TaskProblem>(new SparseLrProblem(
        std::move(data), rows, std::max<uint64_t>(features, 1)));
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "unknown problem kind '", spec.kind(), "' (softmax, sparse_lr)"));
}

}  // namespace downpour
