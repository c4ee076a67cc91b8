// A dense model's replica in a worker (softmax or mlp on Fashion-MNIST):
// this worker's shard of the training set (and the test set on rank 0),
// the model, its parameter tables (one per ParamBlock, following the job's
// policy) and the local parameter array, with the operations every dense
// training loop needs on them. Private to worker/.
//
// Thread-safety: PullParams and PushGrads may run on several threads at
// once (Hogwild; their writes to params() race by design, see worker.h);
// everything else belongs to the training thread.
#ifndef DOWNPOUR_WORKER_INTERNAL_DENSE_REPLICA_H_
#define DOWNPOUR_WORKER_INTERNAL_DENSE_REPLICA_H_

#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "client/client.h"
#include "models/dataset.h"
#include "models/model.h"
#include "worker/internal/step_context.h"

namespace downpour {

class DenseReplica {
 public:
  // Loads the shard of rank ctx->rank() (strided, models/dataset.h), builds
  // the model on options().device, declares its tables (rank 0 writes the
  // initial values from options().seed) and waits until every worker of
  // the job has (barrier "init-params"). kInvalidArgument for an unknown
  // model or device; the loader's and the servers' errors otherwise.
  // `ctx` must outlive the replica.
  static absl::StatusOr<std::unique_ptr<DenseReplica>> Create(StepContext* ctx);

  const Model& model() const { return *model_; }
  const Dataset& train() const { return train_; }
  const std::vector<ParamBlock>& blocks() const { return blocks_; }
  const std::vector<Table>& tables() const { return tables_; }
  // The local copy of the parameters: the blocks concatenated.
  std::vector<float>& params() { return params_; }

  // Issues one operation per parameter table, all in flight together, and
  // waits for them; the first error. `op(table, keys, offset, count)`
  // returns the ticket of the operation on floats [offset, offset + count)
  // of the parameter layout.
  template <typename Op>
  absl::Status ForEachBlock(Op op) const {
    std::vector<Ticket> tickets;
    size_t off = 0;
    for (size_t i = 0; i < blocks_.size(); ++i) {
      const size_t n = blocks_[i].rows * blocks_[i].width;
      tickets.push_back(
          op(tables_[i], Keys::Range(0, blocks_[i].rows), off, n));
      off += n;
    }
    absl::Status status;
    for (Ticket t : tickets) {
      absl::Status s = ctx_->client().Wait(t);
      if (status.ok()) status = s;
    }
    return status;
  }
  // Pulls every table into params().
  absl::Status PullParams();
  // Pushes `grads` (the parameter layout) to every table.
  absl::Status PushGrads(const std::vector<float>& grads);

  // Rank 0 evaluates params() on the test set after iteration `clock`
  // every eval_every clocks and after the last, and logs it with `loss`;
  // returns the accuracy, or -1 when it does not evaluate. `pull_first`:
  // params() may be behind the servers, pull them first.
  absl::StatusOr<double> MaybeEvaluate(int64_t clock, double loss,
                                       bool pull_first);
  // (accuracy, loss) of params() on the test set. REQUIRES: rank 0.
  std::pair<double, double> Evaluate() const;

 private:
  explicit DenseReplica(StepContext* ctx) : ctx_(ctx) {}
  absl::Status Init();
  absl::Status DeclareTables();

  StepContext* const ctx_;
  Dataset train_;
  Dataset test_;  // rank 0 only
  std::unique_ptr<Model> model_;
  std::vector<ParamBlock> blocks_;
  std::vector<Table> tables_;
  std::vector<float> params_;
};

}  // namespace downpour

#endif  // DOWNPOUR_WORKER_INTERNAL_DENSE_REPLICA_H_
