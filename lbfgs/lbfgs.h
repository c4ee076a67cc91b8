// Sandblaster L-BFGS: limited-memory BFGS whose vectors live wherever a
// VectorSpace keeps them (on the parameter servers, or in this process for
// the reference run), driven by scalars alone.
//
// The driver never sees a vector: it sends commands (copy, scale, axpy,
// linear combination, fused with dot products) and receives dot products.
// Each objective evaluation asks an Objective to add the data term's
// gradient at vector kX into vector kG; the driver adds the L2 term
// (lambda / 2 ||x||^2 over the regularized keys) itself, on the servers.
//
//   ServerVectorSpace space(client, table);      // lbfgs/coordinator.h
//   DP_ASSIGN_OR_RETURN(LbfgsResult r,
//                       MinimizeLbfgs(&space, &objective, options, log));
//
// Algorithm (Nocedal & Wright, Numerical Optimization, 2nd ed.): the
// two-loop recursion with history m and initial scaling s'y / y'y
// (Alg. 7.4), and a line search satisfying the strong Wolfe conditions with
// c1 = 1e-4, c2 = 0.9 (Alg. 3.5 and 3.6, cubic interpolation in zoom). The
// first step has length 1 / ||g||; later ones start at 1. Scalars are
// doubles; vectors are floats (updates are computed in double and rounded
// once, see handlers/vector_kernel.h).
#ifndef DOWNPOUR_LBFGS_LBFGS_H_
#define DOWNPOUR_LBFGS_LBFGS_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "lbfgs/problem.h"
#include "proto/downpour.pb.h"

namespace downpour {

// Where the vectors live: runs one command, returns its dot products.
class VectorSpace {
 public:
  virtual ~VectorSpace() = default;
  virtual absl::StatusOr<std::vector<double>> Run(
      const proto::VectorCommand& command) = 0;
};

// The data term of the objective.
class Objective {
 public:
  virtual ~Objective() = default;
  // Adds the data term's gradient at vector kX into vector kG, which the
  // driver has zeroed and opened for accumulation round `round` (> 0, new for
  // every call), and returns the data term's value.
  virtual absl::StatusOr<double> Evaluate(int64_t round) = 0;
};

// The vectors of an L-BFGS table: x (the point evaluated; the parameters),
// g (its gradient), x0 and g0 (the last accepted point), d (the direction),
// then the history s_0..s_{m-1} and y_0..y_{m-1}.
struct LbfgsVectors {
  static constexpr uint32_t kX = 0, kG = 1, kX0 = 2, kG0 = 3, kD = 4;
  static uint32_t S(int i) { return 5 + i; }
  static uint32_t Y(int history, int i) { return 5 + history + i; }
  static std::vector<std::string> Names(int history);
};

struct LbfgsOptions {
  int history = 10;  // m
  int max_iterations = 100;
  double lambda = 1e-4;           // L2 weight
  uint64_t regularized_keys = 0;  // keys [0, this) get the L2 term
  double gtol = 1e-6;             // stop when ||g|| <= gtol * max(1, ||x||)
  double ftol = 1e-10;  // stop when |f_k - f_{k+1}| <= ftol * max(|f|, 1)
  int max_evaluations_per_search = 25;
};

struct IterationRecord {
  int iteration = 0;  // 0: the starting point
  double f = 0;
  double gnorm = 0;
  double step = 0;      // accepted step length t (x = x0 + t d)
  int evaluations = 0;  // objective evaluations so far
  double seconds = 0;   // since the start
};

struct LbfgsResult {
  std::vector<IterationRecord> iterations;
  std::string stop_reason;  // "gradient norm", "objective change", ...
};

// Minimizes from the point held in vector kX. On return kX holds the best
// point. Errors: those of the space and the objective.
absl::StatusOr<LbfgsResult> MinimizeLbfgs(
    VectorSpace* space, Objective* objective, const LbfgsOptions& options,
    const std::function<void(const IterationRecord&)>& on_iteration = nullptr);

// How a run saves its progress and goes on from it (ps_lbfgs
// --checkpoint_every_iterations and --resume). The driver's scalars
// (proto::LbfgsState) and the table's vectors together are the whole state,
// and they agree only at an iteration boundary, where x0 = x and g0 = g: so
// that is where `save` is called and where a resumed run begins.
struct LbfgsRunControl {
  std::function<void(const IterationRecord&)> on_iteration;
  // After every `save_every`-th accepted iteration (0: never) that does
  // not end the run, with the space untouched until `save` returns: the
  // caller snapshots the vectors with the state (its `table` is left
  // empty). An error ends the run.
  int save_every = 0;
  std::function<absl::Status(const proto::LbfgsState&)> save;
  // Go on after `resume->iteration()` instead of starting at x: the space
  // must hold the vectors as they were when the state was saved. The first
  // record reported is that iteration's.
  std::optional<proto::LbfgsState> resume;
  // Accumulation rounds opened are above this: a restarted coordinator
  // must not reopen a round that the lost one may have opened, or a stale
  // task's gradient would be counted in it.
  int64_t min_round = 0;
};

// As above; with control.resume, a run that was saved and is taken up
// again does exactly what the uninterrupted run would have done (same
// commands, same scalars) from the next iteration on.
absl::StatusOr<LbfgsResult> MinimizeLbfgs(VectorSpace* space,
                                          Objective* objective,
                                          const LbfgsOptions& options,
                                          const LbfgsRunControl& control);

// Splits examples [0, n) into `tasks` near-equal contiguous ranges (fewer if
// n < tasks): the same split everywhere, so task ids mean the same ranges.
std::vector<std::pair<uint64_t, uint64_t>> SplitTasks(uint64_t n, int tasks);

// Vectors in this process: the reference run.
class LocalVectorSpace final : public VectorSpace {
 public:
  LocalVectorSpace(size_t num_vectors, uint64_t num_keys, uint32_t width);
  absl::StatusOr<std::vector<double>> Run(
      const proto::VectorCommand& command) override;
  std::vector<float>& vector(uint32_t v) { return vectors_[v]; }

 private:
  const uint64_t num_keys_;
  const uint32_t width_;
  std::vector<std::vector<float>> vectors_;
};

// The data term computed here, task by task in order, with the same task
// code as the workers: the single-process reference.
class LocalObjective final : public Objective {
 public:
  // `problem` and `space` must outlive this.
  LocalObjective(const TaskProblem* problem, LocalVectorSpace* space,
                 int tasks);
  absl::StatusOr<double> Evaluate(int64_t round) override;

 private:
  const TaskProblem* problem_;
  LocalVectorSpace* space_;
  const std::vector<std::pair<uint64_t, uint64_t>> tasks_;
};

}  // namespace downpour

#endif  // DOWNPOUR_LBFGS_LBFGS_H_
