// The objectives Sandblaster L-BFGS minimizes, cut into tasks: a task is a
// range of training examples, and computing it gives that range's share of
// the mean loss and of its gradient. The same code runs in the workers
// (distributed) and in the single-process reference, so the two differ
// only in the order in which floats are summed.
//
//   DP_ASSIGN_OR_RETURN(auto problem, TaskProblem::Load(spec));
//   std::vector<Key> keys = problem->TaskKeys(begin, end);  // empty: all
//   ... read x at those keys (or all) into x ...
//   double loss = problem->Compute(begin, end, x, grad);    // grad: same keys
//
// The L2 term is not part of a task: the coordinator adds it on the servers
// (lambda / 2 ||x||^2 over RegularizedKeys(), and lambda x to the gradient).
#ifndef DOWNPOUR_LBFGS_PROBLEM_H_
#define DOWNPOUR_LBFGS_PROBLEM_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "common/types.h"
#include "proto/downpour.pb.h"

namespace downpour {

class TaskProblem {
 public:
  // Loads the training data `spec` names ("softmax": Fashion-MNIST from
  // data_path; "sparse_lr": a libsvm file, or generated click data).
  // kInvalidArgument for an unknown kind; the loaders' errors otherwise.
  static absl::StatusOr<std::unique_ptr<TaskProblem>> Load(
      const proto::SandblasterProblem& spec);
  virtual ~TaskProblem() = default;

  virtual uint64_t num_examples() const = 0;
  // The parameter table's shape: num_keys() keys of width() floats.
  virtual uint64_t num_keys() const = 0;
  virtual uint32_t width() const = 0;
  // Keys [0, RegularizedKeys()) are regularized (softmax: the weights, not
  // the biases).
  virtual uint64_t RegularizedKeys() const = 0;

  // The keys a task over examples [begin, end) reads and writes, sorted;
  // empty means every key (dense problems).
  virtual std::vector<Key> TaskKeys(uint64_t begin, uint64_t end) const = 0;
  // Sum over examples [begin, end) of their loss, divided by num_examples(),
  // and its gradient written (not added) into `grad`. `x` and `grad` hold
  // the keys TaskKeys gave (all keys when it was empty), width() floats
  // each. REQUIRES: begin < end <= num_examples().
  virtual double Compute(uint64_t begin, uint64_t end,
                         absl::Span<const float> x,
                         absl::Span<float> grad) const = 0;

  // (accuracy, mean loss without L2) of parameters `x` (all keys) on the
  // held-out data: Fashion-MNIST's test set, or the last 10% of generated
  // rows (which training then excludes). kFailedPrecondition if there is
  // none (a libsvm file).
  virtual absl::StatusOr<std::pair<double, double>> Evaluate(
      absl::Span<const float> x) const = 0;
};

}  // namespace downpour

#endif  // DOWNPOUR_LBFGS_PROBLEM_H_
