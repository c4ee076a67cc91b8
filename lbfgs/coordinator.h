// The Sandblaster coordinator (binary ps_lbfgs): runs L-BFGS on vectors that
// stay on the parameter servers, and hands gradient tasks to workers.
//
//   CoordinatorOptions o;  o.scheduler_address = ...;
//   o.problem.set_kind("softmax"); ... DP_ASSIGN_OR_RETURN(auto c,
//   Coordinator::Start(o));   // table + service
//   ... workers: ps_worker --job=lbfgs --coordinator=<c->address()> ...
//   DP_ASSIGN_OR_RETURN(LbfgsResult r, c->Run(print_progress));
//
// The parameter table holds LbfgsVectors::Names(history) as named vectors.
// Each objective evaluation opens a round on the gradient vector, splits the
// training examples into `tasks` ranges and waits until every range has a
// counted result (TaskPool); workers pull x, compute their range's loss and
// gradient, add the gradient into g exactly once (Client::AddOnce) and
// report the loss. Between coordinator and servers only commands and
// scalars travel (traffic()).
//
// A restarted coordinator resumes (options.resume): the state of the
// driver (proto::LbfgsState) is saved with a checkpoint at an iteration
// boundary (options.checkpoint_every_iterations), and a new coordinator
// restores that checkpoint and goes on after its iteration. Workers wait
// for a lost coordinator (ps_worker --coordinator_timeout_ms) at the same
// address.
#ifndef DOWNPOUR_LBFGS_COORDINATOR_H_
#define DOWNPOUR_LBFGS_COORDINATOR_H_

#include <functional>
#include <memory>
#include <string>
#include <utility>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "client/client.h"
#include "common/auth.h"
#include "lbfgs/lbfgs.h"
#include "lbfgs/task_pool.h"
#include "proto/downpour.pb.h"

namespace downpour {

struct CoordinatorOptions {
  std::string scheduler_address;
  // The cluster's security (common/auth.h): used towards the scheduler and
  // servers, and applied by the task service to every worker's call (token,
  // TLS).
  ClusterAuth auth;
  std::string listen_address = "127.0.0.1:0";  // the Sandblaster gRPC service
  // kind and data (softmax: data_path is the Fashion-MNIST folder;
  // sparse_lr: a libsvm file, or empty for generated click data).
  proto::SandblasterProblem problem;
  std::string table = "lbfgs";
  LbfgsOptions lbfgs;  // regularized_keys is set from the problem
  int tasks = 32;      // per objective evaluation
  bool backup_tasks = true;
  absl::Duration task_lease = absl::Seconds(30);
  absl::Duration evaluation_timeout = absl::Minutes(10);
  // Checkpoints (they need the scheduler's --state_dir and servers with a
  // --data_dir): after every this many iterations (0: never) the
  // coordinator has the scheduler take one, with its driver state in the
  // manifest. A failed one is logged and the run goes on.
  int checkpoint_every_iterations = 0;
  // At start, if a complete checkpoint holds an L-BFGS state of this
  // table, roll the job back to the newest such checkpoint and go on after
  // its iteration, instead of starting at iteration 0.
  bool resume = true;
};

class Coordinator {
 public:
  // Loads the problem (for its shape and the held-out data), declares the
  // table and starts serving tasks.
  static absl::StatusOr<std::unique_ptr<Coordinator>> Start(
      const CoordinatorOptions& options);
  virtual ~Coordinator() = default;

  // host:port of the task service.
  virtual std::string address() const = 0;
  // Minimizes; afterwards every worker is told the job is done.
  virtual absl::StatusOr<LbfgsResult> Run(
      const std::function<void(const IterationRecord&)>& on_iteration) = 0;
  // (accuracy, loss) of the current x on the held-out data (pulls x once).
  virtual absl::StatusOr<std::pair<double, double>> EvaluateHeldOut() = 0;
  virtual TaskStats task_stats() const = 0;
  // Data-plane traffic between this coordinator and the servers.
  virtual TrafficStats traffic() const = 0;
  // Stops the service; workers then see the coordinator gone.
  virtual void Shutdown() = 0;
};

// The single-process reference: the same L-BFGS, line search and task code
// on vectors in this process.
absl::StatusOr<LbfgsResult> RunLocalLbfgs(
    const TaskProblem& problem, const LbfgsOptions& options, int tasks,
    const std::function<void(const IterationRecord&)>& on_iteration,
    std::vector<float>* x_out = nullptr);

}  // namespace downpour

#endif  // DOWNPOUR_LBFGS_COORDINATOR_H_
