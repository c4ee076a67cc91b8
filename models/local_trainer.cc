#include "models/local_trainer.h"

#include <Eigen/Dense>
#include <algorithm>
#include <chrono>
#include <cmath>
#include <memory>
#include <numeric>
#include <random>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/random.h"
#include "models/model.h"

namespace downpour {
namespace {

double SecondsSince(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
      .count();
}

absl::Status ValidateOptions(const LocalTrainOptions& o) {
  if (o.model != "softmax" && o.model != "mlp") {
    return absl::InvalidArgumentError(
        absl::StrCat("model '", o.model, "' (want softmax or mlp)"));
  }
  if (o.epochs < 0 || o.batch < 1 || o.threads < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "epochs ", o.epochs, ", batch ", o.batch, ", threads ", o.threads,
        " (want epochs >= 0, batch >= 1, threads >= 1)"));
  }
  if (!(o.lr > 0) || !std::isfinite(o.lr) || !(o.l2 >= 0) ||
      !std::isfinite(o.l2) || !(o.lr_decay_to >= 0 && o.lr_decay_to <= 1)) {
    return absl::InvalidArgumentError(
        absl::StrCat("lr ", o.lr, ", lr_decay_to ", o.lr_decay_to, ", l2 ",
                     o.l2, " (want lr > 0, lr_decay_to in [0, 1], l2 >= 0)"));
  }
  if (o.model == "mlp" && std::any_of(o.hidden.begin(), o.hidden.end(),
                                      [](int h) { return h < 1; })) {
    return absl::InvalidArgumentError(absl::StrCat(
        "hidden sizes ", absl::StrJoin(o.hidden, ","), " (want all >= 1)"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<LocalTrainResult> TrainLocal(const LocalTrainOptions& options) {
  // Bad options fail before the second or so of loading.
  if (absl::Status st = ValidateOptions(options); !st.ok()) return st;
  const auto start = std::chrono::steady_clock::now();
  absl::StatusOr<Dataset> train = LoadFashionMnist(options.data_dir, true);
  if (!train.ok()) return train.status();
  absl::StatusOr<Dataset> test = LoadFashionMnist(options.data_dir, false);
  if (!test.ok()) return test.status();
  const double load_seconds = SecondsSince(start);
  absl::StatusOr<LocalTrainResult> result = TrainLocal(options, *train, *test);
  if (result.ok()) result->load_seconds = load_seconds;
  return result;
}

absl::StatusOr<LocalTrainResult> TrainLocal(const LocalTrainOptions& options,
                                            const Dataset& train,
                                            const Dataset& test) {
  if (absl::Status st = ValidateOptions(options); !st.ok()) return st;
  if (train.num_examples < 1 || test.num_examples < 1 ||
      train.dim != test.dim || train.num_classes != test.num_classes ||
      train.dim < 1 || train.num_classes < 2) {
    return absl::InvalidArgumentError(absl::StrCat(
        "train set ", train.num_examples, " x ", train.dim, " (",
        train.num_classes, " classes), test set ", test.num_examples, " x ",
        test.dim, " (", test.num_classes, " classes)"));
  }
  std::unique_ptr<Model> model;
  if (options.model == "softmax") {
    model = MakeSoftmaxRegression(train.dim, train.num_classes, options.l2,
                                  options.threads);
  } else {
    std::vector<int> sizes = {train.dim};
    sizes.insert(sizes.end(), options.hidden.begin(), options.hidden.end());
    sizes.push_back(train.num_classes);
    model = MakeMlp(std::move(sizes), options.l2, options.threads);
  }
  LocalTrainResult result;
  result.params.resize(model->NumParams());
  std::vector<float> grad(model->NumParams());
  model->Init(options.seed, result.params.data());
  Eigen::Map<Eigen::VectorXf> params(result.params.data(),
                                     result.params.size());
  const Eigen::Map<const Eigen::VectorXf> g(grad.data(), grad.size());

  const int n = options.max_train_examples > 0
                    ? std::min(options.max_train_examples, train.num_examples)
                    : train.num_examples;
  const int steps_per_epoch = (n + options.batch - 1) / options.batch;
  const double total_steps =
      std::max(1.0, static_cast<double>(steps_per_epoch) * options.epochs - 1);
  int64_t step = 0;
  std::vector<int> order(n);
  std::vector<int> batch;
  batch.reserve(options.batch);
  for (int epoch = 1; epoch <= options.epochs; ++epoch) {
    const auto start = std::chrono::steady_clock::now();
    // A fresh permutation per epoch, from (seed, epoch) alone, so an epoch
    // can be replayed without the ones before it.
    std::iota(order.begin(), order.end(), 0);
    std::mt19937_64 rng(StreamSeed(options.seed, epoch));
    Shuffle(absl::MakeSpan(order), rng);
    double loss_sum = 0;
    int steps = 0;
    for (int b = 0; b < n; b += options.batch) {
      batch.assign(order.begin() + b,
                   order.begin() + std::min(n, b + options.batch));
      loss_sum += model->LossAndGradient(result.params.data(), train, batch,
                                         grad.data());
      const double progress = static_cast<double>(step++) / total_steps;
      const float lr = static_cast<float>(
          options.lr * (1.0 - (1.0 - options.lr_decay_to) * progress));
      params -= lr * g;
      ++steps;
    }
    EpochStats stats;
    stats.epoch = epoch;
    stats.seconds = SecondsSince(start);
    stats.train_loss = loss_sum / std::max(steps, 1);
    const auto eval_start = std::chrono::steady_clock::now();
    std::tie(stats.test_accuracy, stats.test_loss) =
        model->Evaluate(result.params.data(), test);
    stats.eval_seconds = SecondsSince(eval_start);
    result.epochs.push_back(stats);
    if (options.on_epoch) options.on_epoch(stats);
  }
  std::tie(result.final_test_accuracy, result.final_test_loss) =
      result.epochs.empty() ? model->Evaluate(result.params.data(), test)
                            : std::make_pair(result.epochs.back().test_accuracy,
                                             result.epochs.back().test_loss);
  return result;
}

}  // namespace downpour
