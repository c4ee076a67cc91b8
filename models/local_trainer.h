// Single-process mini-batch SGD on Fashion-MNIST with the same model code the
// workers run, and no servers: the baseline that distributed runs are
// compared against, in benchmarks (bench/) and in tests.
//
//   LocalTrainOptions o;
//   o.model = "mlp";
//   o.on_epoch = [](const EpochStats& s) { ... };
//   DP_ASSIGN_OR_RETURN(LocalTrainResult r, TrainLocal(o));
//
// Each epoch visits every training example once, in an order reshuffled
// from (seed, epoch), in batches of `batch` (the last may be smaller), and
// applies params -= lr_t * gradient after each (lr_t: see lr_decay_to).
// Deterministic for fixed options. Blocks; runs on the caller's thread plus
// up to threads - 1 more.
#ifndef DOWNPOUR_MODELS_LOCAL_TRAINER_H_
#define DOWNPOUR_MODELS_LOCAL_TRAINER_H_

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "models/dataset.h"

namespace downpour {

struct EpochStats {
  int epoch = 0;             // 1-based
  double seconds = 0;        // wall time of the epoch's SGD steps only
  double train_loss = 0;     // mean of the epoch's mini-batch losses
  double test_accuracy = 0;  // on the test set after the epoch
  double test_loss = 0;      // mean cross-entropy on the test set
  double eval_seconds = 0;   // wall time of that evaluation
};

struct LocalTrainOptions {
  std::string model = "softmax";    // "softmax" or "mlp"
  std::vector<int> hidden = {128};  // MLP hidden layer sizes
  int epochs = 2;
  int batch = 64;
  float lr = 0.1f;
  // The learning rate falls linearly from lr at the first step to
  // lr * lr_decay_to at the last one; 1 keeps it constant (as the workers
  // do), 0 ends at zero, which removes most of the last iterate's SGD noise.
  float lr_decay_to = 1.0f;
  float l2 = 0;
  int threads = 1;    // for the model's math; see model.h
  uint64_t seed = 1;  // parameter init and batch order
  std::string data_dir = "/usr/share/datasets/fashion-mnist";
  // If > 0, train on only the first max_train_examples examples (for quick
  // runs); the test set is always whole.
  int max_train_examples = 0;
  // Called after each epoch, on the calling thread; may be empty.
  std::function<void(const EpochStats&)> on_epoch;
};

struct LocalTrainResult {
  std::vector<EpochStats> epochs;
  double final_test_accuracy = 0;
  double final_test_loss = 0;
  double load_seconds = 0;    // reading the data set; 0 if it was given
  std::vector<float> params;  // the trained parameters
};

// Loads Fashion-MNIST from options.data_dir and trains.
// Errors: kInvalidArgument for bad options (unknown model, epochs < 0,
// batch < 1, lr <= 0 or not finite, lr_decay_to outside [0, 1], l2 < 0,
// threads < 1, a hidden size < 1);
// the loader's kNotFound / kDataLoss, with the directory in the message.
absl::StatusOr<LocalTrainResult> TrainLocal(const LocalTrainOptions& options);

// Trains on `train` and evaluates on `test` (already loaded, e.g. shared by
// several runs); options.data_dir is ignored. Same option errors, plus
// kInvalidArgument if the sets are empty or differ in dim or classes.
absl::StatusOr<LocalTrainResult> TrainLocal(const LocalTrainOptions& options,
                                            const Dataset& train,
                                            const Dataset& test);

}  // namespace downpour

#endif  // DOWNPOUR_MODELS_LOCAL_TRAINER_H_
