#include "worker/internal/dense_replica.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "common/status_macros.h"
#include "models/cuda/cuda_mlp.h"

namespace downpour {

absl::StatusOr<std::unique_ptr<DenseReplica>> DenseReplica::Create(
    StepContext* ctx) {
  std::unique_ptr<DenseReplica> r(new DenseReplica(ctx));
  DP_RETURN_IF_ERROR(r->Init());
  return r;
}

absl::Status DenseReplica::Init() {
  const WorkerOptions& o = ctx_->options();
  const int rank = ctx_->rank();
  DP_ASSIGN_OR_RETURN(Dataset full, LoadFashionMnist(o.data_dir, true));
  // With elastic seats every worker holds every example and trains its
  // share of each epoch (worker/example_stream.h).
  const int dim = full.dim, classes = full.num_classes;
  if (ExampleStream::SplitsEpochs(ctx_->policy())) {
    train_ = std::move(full);
  } else {
    train_ = Shard(full, ctx_->data_shard(), ctx_->policy().total_workers());
  }
  if (rank == 0) {
    DP_ASSIGN_OR_RETURN(test_, LoadFashionMnist(o.data_dir, false));
  }
  if (o.device != "cpu" && (o.device != "cuda" || o.model != "mlp")) {
    return absl::InvalidArgumentError(
        absl::StrCat("device '", o.device, "' for model '", o.model,
                     "' (cpu; cuda for mlp only)"));
  }
  if (o.device == "cuda") {
    DP_ASSIGN_OR_RETURN(model_, MakeCudaMlp({dim, 256, classes}));
  } else if (o.model == "softmax") {
    model_ = MakeSoftmaxRegression(dim, classes, /*l2=*/0, o.threads);
  } else if (o.model == "mlp") {
    model_ = MakeMlp({dim, 256, classes}, /*l2=*/0, o.threads);
  } else {
    return absl::InvalidArgumentError(absl::StrCat(
        "unknown model '", o.model, "' (softmax, mlp, sparse_lr)"));
  }
  blocks_ = model_->Blocks();
  params_.resize(model_->NumParams());
  DP_LOG(INFO) << "shard of " << train_.num_examples << " examples, model "
               << o.model << " with " << params_.size() << " parameters";
  return DeclareTables();
}

absl::Status DenseReplica::DeclareTables() {
  const WorkerOptions& o = ctx_->options();
  // Every worker declares the same tables (identical specs are idempotent);
  // rank 0 then writes the initial values and the others wait for it.
  for (const ParamBlock& b : blocks_) {
    TableOptions t;
    t.name = absl::StrCat(o.model, "/", b.name);
    t.width = static_cast<uint32_t>(b.width);
    t.num_keys = b.rows;
    // The scheduler sets how the servers enforce the job's policy.
    t.follows_job = true;
    if (ctx_->policy().is_bsp()) {
      // The servers average the N gradients of a step; the workers scale
      // them by the BSP learning rate (models/learning_rate.h), and the
      // servers apply the mean with rate 1, as plain SGD or heavy-ball
      // momentum (v = momentum * v + g; w -= v).
      if (o.momentum > 0) {
        t.handler = "momentum";
        t.handler_params = {{"learning_rate", 1.0}, {"momentum", o.momentum}};
      } else {
        t.handler = "sgd";
        t.handler_params = {{"learning_rate", 1.0}};
      }
    } else {
      t.handler = "adagrad";
      t.handler_params = {{"learning_rate", o.async_lr},
                          {"initial_accumulator", 0.1}};
    }
    DP_ASSIGN_OR_RETURN(Table table, ctx_->client().CreateTable(t));
    tables_.push_back(table);
  }
  // Tables that hold trained values (a job restored from a checkpoint, or a
  // running job that a replacement of a lost worker joins) are not
  // initialized, and nobody waits at the barrier for that: in a running job
  // the others are long past it.
  if (ctx_->resumed()) return absl::OkStatus();
  if (ctx_->rank() == 0) {
    model_->Init(o.seed, params_.data());
    size_t off = 0;
    for (size_t i = 0; i < blocks_.size(); ++i) {
      const size_t n = blocks_[i].rows * blocks_[i].width;
      DP_RETURN_IF_ERROR(
          ctx_->client().PutSync(tables_[i], Keys::Range(0, blocks_[i].rows),
                                 absl::MakeConstSpan(params_.data() + off, n)));
      off += n;
    }
  }
  DP_RETURN_IF_ERROR(
      ctx_->member().Barrier(StepContext::kInitBarrier, absl::Seconds(120)));
  DP_LOG(INFO) << "parameters initialized (every worker passed '"
               << StepContext::kInitBarrier << "')";
  return absl::OkStatus();
}

absl::Status DenseReplica::PullParams() {
  Client& client = ctx_->client();
  return ForEachBlock([&](const Table& t, Keys k, size_t off, size_t n) {
    return client.Pull(t, k, absl::MakeSpan(params_.data() + off, n));
  });
}

absl::Status DenseReplica::PushGrads(const std::vector<float>& grads) {
  Client& client = ctx_->client();
  return ForEachBlock([&](const Table& t, Keys k, size_t off, size_t n) {
    return client.Push(t, k, absl::MakeConstSpan(grads.data() + off, n));
  });
}

absl::StatusOr<double> DenseReplica::MaybeEvaluate(int64_t clock, double loss,
                                                   bool pull_first) {
  const WorkerOptions& o = ctx_->options();
  const bool last = clock + 1 == o.steps;
  if (ctx_->rank() != 0 || ((clock + 1) % o.eval_every != 0 && !last)) {
    return -1.0;
  }
  if (pull_first) DP_RETURN_IF_ERROR(PullParams());
  auto [accuracy, test_loss] = Evaluate();
  DP_LOG(INFO) << "clock " << clock + 1 << ": train loss " << loss
               << ", test accuracy " << accuracy << ", test loss " << test_loss;
  return accuracy;
}

std::pair<double, double> DenseReplica::Evaluate() const {
  return model_->Evaluate(params_.data(), test_);
}

}  // namespace downpour
