// local_trainer: single-process SGD on Fashion-MNIST, the baseline for the
// distributed runs. Prints one line per epoch and a final summary.
//
//   bazel run -c opt //models:local_trainer -- --model=mlp --epochs=5
#include <cstdio>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_join.h"
#include "common/usage.h"
#include "models/local_trainer.h"

ABSL_FLAG(std::string, model, "softmax", "softmax or mlp");
ABSL_FLAG(std::vector<std::string>, hidden, {"128"},
          "MLP hidden layer sizes, comma-separated");
ABSL_FLAG(int, epochs, 2, "passes over the training set");
ABSL_FLAG(int, batch, 64, "mini-batch size");
ABSL_FLAG(double, lr, 0.1, "SGD learning rate");
ABSL_FLAG(double, lr_decay_to, 1.0,
          "the learning rate falls linearly to lr * lr_decay_to by the last "
          "step (1: constant)");
ABSL_FLAG(double, l2, 0.0, "L2 regularization on the weights");
ABSL_FLAG(int, threads, 1, "threads for the model's math");
ABSL_FLAG(std::string, data_dir, "/usr/share/datasets/fashion-mnist",
          "directory of the Fashion-MNIST .gz files");
ABSL_FLAG(uint64_t, seed, 1, "seed for init and batch order");
ABSL_FLAG(int, max_train_examples, 0,
          "train on only this many examples (0: all)");

int main(int argc, char** argv) {
  downpour::SetUsage(
      "single-process SGD on Fashion-MNIST, the baseline (usage: "
      "local_trainer [--model=softmax|mlp] [flags])");
  absl::ParseCommandLine(argc, argv);
  downpour::LocalTrainOptions o;
  o.model = absl::GetFlag(FLAGS_model);
  o.hidden.clear();
  for (const std::string& h : absl::GetFlag(FLAGS_hidden)) {
    int size;
    if (!absl::SimpleAtoi(h, &size)) {
      std::fprintf(stderr, "--hidden: '%s' is not an integer\n", h.c_str());
      return 2;
    }
    o.hidden.push_back(size);
  }
  o.epochs = absl::GetFlag(FLAGS_epochs);
  o.batch = absl::GetFlag(FLAGS_batch);
  o.lr = static_cast<float>(absl::GetFlag(FLAGS_lr));
  o.lr_decay_to = static_cast<float>(absl::GetFlag(FLAGS_lr_decay_to));
  o.l2 = static_cast<float>(absl::GetFlag(FLAGS_l2));
  o.threads = absl::GetFlag(FLAGS_threads);
  o.data_dir = absl::GetFlag(FLAGS_data_dir);
  o.seed = absl::GetFlag(FLAGS_seed);
  o.max_train_examples = absl::GetFlag(FLAGS_max_train_examples);
  o.on_epoch = [](const downpour::EpochStats& s) {
    std::printf(
        "epoch %d  time %.3f s  train_loss %.4f  test_acc %.4f  test_loss "
        "%.4f  (eval %.3f s)\n",
        s.epoch, s.seconds, s.train_loss, s.test_accuracy, s.test_loss,
        s.eval_seconds);
    std::fflush(stdout);
  };
  std::printf(
      "model %s%s  epochs %d  batch %d  lr %g (to x%g)  l2 %g  threads %d\n",
      o.model.c_str(),
      o.model == "mlp" ? (" hidden " + absl::StrJoin(o.hidden, ",")).c_str()
                       : "",
      o.epochs, o.batch, o.lr, o.lr_decay_to, o.l2, o.threads);
  absl::StatusOr<downpour::LocalTrainResult> r = downpour::TrainLocal(o);
  if (!r.ok()) {
    std::fprintf(stderr, "local_trainer: %s\n", r.status().ToString().c_str());
    return 1;
  }
  double train_seconds = 0;
  for (const auto& e : r->epochs) train_seconds += e.seconds;
  std::printf(
      "final test_acc %.4f  test_loss %.4f  load %.2f s  train %.2f s "
      "(%.3f s/epoch)\n",
      r->final_test_accuracy, r->final_test_loss, r->load_seconds,
      train_seconds,
      r->epochs.empty() ? 0.0 : train_seconds / r->epochs.size());
  return 0;
}
