// sparse_lr: sparse logistic regression on one sparse table of width 1
// keyed by SparseFeatureKey(feature id). Each step pulls the weights of the
// batch's distinct ids and pushes their gradients; the servers run Adagrad
// under every policy (under BSP they apply each clock's mean gradient per
// key once all N workers pushed). Rank 0 evaluates on the held-out rows.
#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "common/status_macros.h"
#include "models/model.h"
#include "models/sparse_lr.h"
#include "worker/internal/training_loop.h"

namespace downpour {
namespace {

class SparseLoop final : public TrainingLoop {
 public:
  explicit SparseLoop(StepContext* ctx) : ctx_(*ctx) {}

  absl::Status Init() {
    DP_RETURN_IF_ERROR(LoadRows());
    return DeclareTable();
  }
  absl::Status Run() override;

 private:
  // This worker's share of the training rows, shuffled; on rank 0 the
  // held-out rows with their feature ids and keys.
  absl::Status LoadRows();
  absl::Status DeclareTable();
  // Rank 0's held-out figures for the weights at `clock`; the accuracy.
  absl::StatusOr<double> Evaluate(int64_t clock, double loss);

  StepContext& ctx_;
  Table table_;
  SparseDataset train_;
  SparseDataset test_;
  std::vector<uint64_t> test_ids_;
  std::vector<Key> test_keys_;
  std::vector<float> test_weights_;
};

absl::Status SparseLoop::LoadRows() {
  const WorkerOptions& o = ctx_.options();
  const int workers = ctx_.policy().total_workers();
  if (o.holdout <= 0 || o.holdout >= 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("holdout ", o.holdout, " outside (0, 1)"));
  }
  SparseDataset all;
  if (!o.libsvm.empty()) {
    DP_ASSIGN_OR_RETURN(all, LoadLibsvmFile(o.libsvm));
  } else {
    if (o.click_rows < 2 || o.click_features_per_row < 1 ||
        o.click_num_features < 1 || o.click_zipf < 0) {
      return absl::InvalidArgumentError(
          "click data: need click_rows >= 2, click_features_per_row >= 1, "
          "click_num_features >= 1, click_zipf >= 0");
    }
    all = GenerateClickData(o.click_rows, o.click_features_per_row,
                            o.click_num_features, o.click_zipf, o.seed);
  }
  const size_t rows = all.NumRows();
  const size_t train_rows = static_cast<size_t>(
      std::floor(static_cast<double>(rows) * (1.0 - o.holdout)));
  if (train_rows < static_cast<size_t>(workers) || train_rows == rows) {
    return absl::InvalidArgumentError(absl::StrCat(
        rows, " rows cannot give ", workers,
        " workers rows to train on and keep ", o.holdout, " of them held out"));
  }
  train_ = SelectRows(
      all, SparseTrainRows(train_rows, ctx_.data_shard(), workers, o.seed));
  if (ctx_.rank() == 0) {
    std::vector<size_t> held(rows - train_rows);
    std::iota(held.begin(), held.end(), train_rows);
    test_ = SelectRows(all, held);
    test_ids_ = BatchFeatureIds(test_, 0, test_.NumRows());
    test_keys_.resize(test_ids_.size());
    for (size_t i = 0; i < test_ids_.size(); ++i) {
      test_keys_[i] = SparseFeatureKey(test_ids_[i]);
    }
  }
  DP_LOG(INFO) << "sparse_lr: " << rows << " rows ("
               << (o.libsvm.empty() ? "synthetic clicks" : o.libsvm) << "), "
               << train_.NumRows() << " to train on here, " << rows - train_rows
               << " held out";
  return absl::OkStatus();
}

absl::Status SparseLoop::DeclareTable() {
  // Rows are created on first push with the initializer's zeros, so no
  // worker writes initial values; the barrier only lines up the start.
  TableOptions t;
  t.name = kSparseLrTable;
  t.width = 1;
  t.sparse = true;
  t.init = "zeros";
  // Adagrad under every policy: with power-law ids the hottest weights
  // get a gradient at every step and the rare ones almost never, and plain
  // SGD at a rate that moves the rare ones diverges on the hot ones. Under
  // BSP the servers hold a clock's key batches until all N workers pushed
  // and apply each key's mean once, summed in rank order, as for the dense
  // tables: runs are bit-for-bit repeatable (the client sends every server
  // a batch each step, empty ones included, so that it can count ranks).
  t.handler = "adagrad";
  t.handler_params = {{"learning_rate", ctx_.options().async_lr},
                      {"initial_accumulator", 0.1}};
  // The scheduler sets sync_workers and tracked_workers from the job.
  t.follows_job = true;
  DP_ASSIGN_OR_RETURN(table_, ctx_.client().CreateTable(t));
  // A resumed job, or a replacement of a lost worker joining a running one
  // (whose other workers are long past the barrier), starts at once.
  if (ctx_.resumed()) return absl::OkStatus();
  return ctx_.member().Barrier(StepContext::kInitBarrier, absl::Seconds(120));
}

absl::StatusOr<double> SparseLoop::Evaluate(int64_t clock, double loss) {
  test_weights_.resize(test_ids_.size());
  DP_RETURN_IF_ERROR(ctx_.client().PullSync(table_, test_keys_,
                                            absl::MakeSpan(test_weights_)));
  const SparseEval e = EvaluateSparseLogReg(test_, test_ids_, test_weights_);
  DP_LOG(INFO) << "clock " << clock << ": train loss " << loss
               << ", held-out log-loss " << e.log_loss << ", accuracy "
               << e.accuracy << ", AUC " << e.auc;
  return e.accuracy;
}

absl::Status SparseLoop::Run() {
  const WorkerOptions& o = ctx_.options();
  Client& client = ctx_.client();
  const int rank = ctx_.rank();
  const bool bsp = ctx_.policy().is_bsp();
  const size_t rows = train_.NumRows();
  const size_t batch = static_cast<size_t>(std::max(1, o.batch));
  std::vector<uint64_t> ids;
  std::vector<Key> keys;
  std::vector<float> weights, grads;
  size_t cursor = 0;
  uint64_t examples = 0;
  double loss = 0;
  // Under BSP the servers apply a clock's round when the last worker's
  // batch arrives, which rank 0 does not see. It evaluates the weights at
  // clock k only once the gate has let clock k start (every push below k
  // acknowledged, so applied): its figures are then repeatable too. Under
  // SSP and ASP it evaluates right after its own push.
  auto eval_due = [&](int64_t k) {
    return rank == 0 && (k % o.eval_every == 0 || k == o.steps);
  };
  // A resumed job skips the batches of the clocks before it.
  for (int64_t c = 0; c < ctx_.start_clock(); ++c) {
    const size_t end = std::min(rows, cursor + batch);
    cursor = end == rows ? 0 : end;
  }
  for (int64_t clock = ctx_.start_clock(); clock < o.steps; ++clock) {
    DP_RETURN_IF_ERROR(ctx_.CheckStop(clock));
    bool done;
    DP_RETURN_IF_ERROR(ctx_.StartStep(&clock, &done));
    if (done) break;
    client.SetWorkerClock(rank, clock);
    double accuracy = -1;
    if (bsp && clock > 0 && eval_due(clock)) {
      DP_ASSIGN_OR_RETURN(accuracy, Evaluate(clock, loss));
    }
    // Batches are consecutive windows of the shuffled shard; the one that
    // reaches the end is shorter and the next starts over.
    const size_t begin = cursor, end = std::min(rows, cursor + batch);
    cursor = end == rows ? 0 : end;
    ids = BatchFeatureIds(train_, begin, end);
    keys.resize(ids.size());
    for (size_t i = 0; i < ids.size(); ++i) keys[i] = SparseFeatureKey(ids[i]);
    weights.resize(ids.size());
    grads.resize(ids.size());
    DP_RETURN_IF_ERROR(client.PullSync(table_, keys, absl::MakeSpan(weights)));
    loss = SparseLogRegLossAndGradient(train_, begin, end, ids, weights,
                                       absl::MakeSpan(grads), o.l2);
    examples += end - begin;
    DP_RETURN_IF_ERROR(client.PushSync(table_, keys, grads));
    if (!bsp && eval_due(clock + 1)) {
      DP_ASSIGN_OR_RETURN(accuracy, Evaluate(clock + 1, loss));
    }
    DP_RETURN_IF_ERROR(ctx_.FinishStep(clock, loss, examples, accuracy));
  }
  if (bsp && rank == 0) {
    // The last round: wait until every worker has pushed it, evaluate, and
    // report the accuracy with the same (final) clock again.
    const int64_t last = o.steps;
    DP_RETURN_IF_ERROR(
        ctx_.member().WaitClock(last, absl::Minutes(2)).status());
    client.SetWorkerClock(rank, last);
    DP_ASSIGN_OR_RETURN(double accuracy, Evaluate(last, loss));
    DP_RETURN_IF_ERROR(ctx_.FinishStep(last - 1, loss, examples, accuracy));
  }
  DP_LOG(INFO) << "done: " << examples << " examples, max staleness "
               << client.max_staleness();
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<TrainingLoop>> NewSparseLoop(StepContext* ctx) {
  auto loop = std::make_unique<SparseLoop>(ctx);
  DP_RETURN_IF_ERROR(loop->Init());
  return std::unique_ptr<TrainingLoop>(std::move(loop));
}

}  // namespace downpour
