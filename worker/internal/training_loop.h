// The training loops of ps_worker, one family per file, behind one small
// interface. worker.cc picks one from the job's policy and the options:
//
//   sparse_lr                          sparse_loop.cc
//   hogwild_threads > 1 (ASP)          hogwild_loop.cc
//   ASP, n_fetch = n_push = 1          asp_pipelined_loop.cc
//   BSP                                bsp_loop.cc
//   SSP, or ASP with n_fetch / n_push  ssp_loop.cc
//
// Each loop runs iterations [0, steps) between StepContext::StartStep and
// FinishStep and leaves the last clock report queued (the worker flushes
// it). Private to worker/.
#ifndef DOWNPOUR_WORKER_INTERNAL_TRAINING_LOOP_H_
#define DOWNPOUR_WORKER_INTERNAL_TRAINING_LOOP_H_

#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "worker/internal/dense_replica.h"
#include "worker/internal/step_context.h"

namespace downpour {

// Not thread-safe: Run() is called once, by the worker's main thread.
class TrainingLoop {
 public:
  virtual ~TrainingLoop() = default;
  // Trains to the end. kDeadlineExceeded if the job stalls; the servers'
  // and the scheduler's errors otherwise.
  virtual absl::Status Run() = 0;
};

// Dense loops over `replica`. `ctx` and `replica` must outlive the loop.
std::unique_ptr<TrainingLoop> NewHogwildLoop(StepContext* ctx,
                                             DenseReplica* replica);
std::unique_ptr<TrainingLoop> NewAspPipelinedLoop(StepContext* ctx,
                                                  DenseReplica* replica);
std::unique_ptr<TrainingLoop> NewBspLoop(StepContext* ctx,
                                         DenseReplica* replica);
std::unique_ptr<TrainingLoop> NewSspLoop(StepContext* ctx,
                                         DenseReplica* replica);

// sparse_lr: loads the rows (options().libsvm or synthetic click data),
// takes this worker's share, declares the weight table and waits for every
// worker (barrier "init-params"). kInvalidArgument for bad data options or
// a malformed file (naming it), kNotFound for a missing one. `ctx` must
// outlive the loop.
absl::StatusOr<std::unique_ptr<TrainingLoop>> NewSparseLoop(StepContext* ctx);

}  // namespace downpour

#endif  // DOWNPOUR_WORKER_INTERNAL_TRAINING_LOOP_H_
