// ps_worker: runs one model replica on its shard of the training data.
//
// A worker joins the job (client/job_member.h: the scheduler gives it a
// rank and the job's consistency policy), declares the model's parameter
// tables (following the job's policy, which the scheduler enforces), and
// then for each iteration c: waits until the policy lets clock c proceed,
// pulls the parameters, computes the loss and gradient of a mini-batch,
// pushes the gradient, waits for the acknowledgements, and advances its
// clock to c + 1 with its loss, so that the scheduler can gate the others
// and report progress.
//
// Learning rates. Under BSP the servers average the N workers' pushes of a
// step (TableSpec.sync_workers), so the global batch is N x batch and the
// rate follows the linear scaling rule, N x lr, reached by a linear warm-up
// over `warmup_steps` (the workers scale their gradients; the servers' SGD
// runs with rate 1, or heavy-ball momentum with `momentum` > 0), optionally
// falling linearly to 0 over the last steps (`lr_decay_from`). Under SSP and
// ASP every push is applied on arrival, so N workers together take N steps per
// round: the servers run Adagrad with `async_lr`, which adapts per coordinate
// and stays stable as N grows.
//
// The clock reports go out from a reporter thread; WaitClock is called only
// when what the worker knows (its own clock, a lower bound on the others')
// does not already let the next clock proceed. Under BSP, dense models
// exchange each part of the gradient for the step's new values with one
// PushPull, sent while the backward pass computes the rest (see
// docs/ARCHITECTURE.md); the replies replace the pull. Under ASP with n_fetch =
// n_push = 1, dense models pipeline: one PushPull per table per step,
// computing the next step while it is in flight (one step staler).
//
// sparse_lr: one sparse table of width 1 keyed by SparseFeatureKey(feature
// id); each step pulls the weights of the batch's distinct ids and pushes
// their gradients, and the servers run Adagrad (async_lr) under every
// policy. Under BSP the table aggregates: each server applies a clock's
// mean gradient per key once all N workers pushed (summed in rank order),
// so runs are bit-for-bit repeatable. Rank 0 evaluates on the held-out
// rows (log-loss, accuracy, AUC); under BSP once the clock's round is in.
//
// Hogwild (hogwild_threads = K > 1, ASP only, softmax or mlp): K threads
// share `steps` iterations, each with its own mini-batches and gradient
// buffer, and all pull into ONE parameter array and read it while the
// others' pulls overwrite it, without locks. Those are deliberate data
// races on plain floats (Hogwild!, Niu et al. 2011): a thread may compute
// on a mix of two versions of the parameters, which SGD tolerates. C++17
// has no std::atomic_ref, and relaxed atomics would need the model's Eigen
// math to read through them (a private copy per step, i.e. not Hogwild);
// on x86-64 and AArch64 aligned 4-byte loads and stores do not tear, so
// each float read is some version of that float. ThreadSanitizer reports
// these races by design.
//
// Files: worker.cc checks the options against the job's policy and picks
// a loop; internal/step_context.h is the gate and report around each step,
// internal/dense_replica.h the dense model's data, tables and parameters,
// and internal/training_loop.h the loops, one file per family (hogwild,
// sparse, asp_pipelined, bsp, ssp).
//
// Not thread-safe: Run() is called once.
#ifndef DOWNPOUR_WORKER_WORKER_H_
#define DOWNPOUR_WORKER_WORKER_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/auth.h"
#include "metrics/registry.h"

namespace downpour {

struct WorkerOptions {
  std::string scheduler_address;
  ClusterAuth auth;  // the cluster secret, if it has one (common/auth.h)
  std::string name;  // stable identity (rank survives restarts)
  // The rank to take (e.g. an Indexed Job's completion index; the scheduler
  // grants exactly it or Create fails: kAlreadyExists while an ALIVE worker
  // holds it, kInvalidArgument outside the job). -1: the scheduler picks.
  int rank = -1;
  // The job token, when the scheduler has one (ps_scheduler
  // --job_token_file): without it a worker gets no rank
  // (kPermissionDenied).
  std::string job_token;
  // If set, a gRPC health service listens here (host:port): liveness
  // (common/grpc_server.h) from the start, readiness once registered.
  std::string health_listen;
  // Called once (from another thread) if the job fails while this worker
  // runs: a lost worker was not replaced in time (kAborted naming it). The
  // training loop may be blocked on the data plane; ps_worker logs the
  // status and exits 1.
  std::function<void(const absl::Status&)> on_job_failed;
  // "softmax", "mlp" (784-256-10) on Fashion-MNIST, or "sparse_lr":
  // sparse logistic regression (see below).
  std::string model = "mlp";
  std::string data_dir = "/usr/share/datasets/fashion-mnist";
  int batch = 64;          // per worker
  int64_t steps = 1000;    // iterations (clock ticks)
  double lr = 0.05;        // BSP: per-worker rate before scaling
  int warmup_steps = 100;  // BSP: linear warm-up to N x lr
  // BSP: < 1 lets the rate fall linearly to 0 from clock lr_decay_from x
  // steps to the last (BspLearningRate); 1 keeps it constant.
  double lr_decay_from = 1.0;
  // BSP: > 0 makes the servers apply each step with heavy-ball momentum
  // (the "momentum" handler) instead of plain SGD.
  double momentum = 0;
  double async_lr = 0.05;  // SSP/ASP: the servers' Adagrad rate
  // ASP only (Downpour; other policies reject values > 1 at Create): pull
  // every n_fetch steps; push the gradients accumulated over n_push steps
  // every n_push steps and at the last step.
  int n_fetch = 1;
  int n_push = 1;
  int eval_every = 100;      // rank 0 evaluates on the test set
  double slow_factor = 1.0;  // > 1: sleep to look that much slower
  // Threads for a CPU model's gradient (models/model.h); other values than
  // 1 change the results in the last bits (partial sums added in order).
  int threads = 1;
  std::string device = "cpu";  // "cpu", or "cuda" (mlp only)
  // > 1: Hogwild inside this worker (ASP and dense models only; see above).
  int hogwild_threads = 1;
  uint64_t seed = 1;

  // sparse_lr only. The rows come from `libsvm` (libsvm text) or, if empty,
  // from GenerateClickData(click_rows, click_features_per_row,
  // click_num_features, click_zipf, seed). Every worker reads the same rows;
  // the last `holdout` fraction is held out for evaluation (rank 0) and the
  // rest is split between the workers by SparseTrainRows. A malformed file
  // fails Create with kInvalidArgument naming the file and the line.
  std::string libsvm;
  int64_t click_rows = 100000;
  int click_features_per_row = 20;
  uint64_t click_num_features = 100000;
  double click_zipf = 1.1;
  double holdout = 0.1;
  float l2 = 0;  // L2 on the weights a batch touches

  // If set (borrowed; must outlive the worker), the worker adds its
  // progress and traffic figures to it (docs/OPERATIONS.md, "Metrics").
  MetricsRegistry* metrics = nullptr;
};

// sparse_lr: the name of the weight table (sparse, width 1, zeros). Its
// keys are SparseFeatureKey(feature id) (models/sparse_lr.h).
inline constexpr char kSparseLrTable[] = "sparse_lr/w";

class Worker {
 public:
  // Joins the job, checks the options against its policy
  // (kInvalidArgument), loads this worker's data shard and declares the
  // model's tables.
  static absl::StatusOr<std::unique_ptr<Worker>> Create(
      const WorkerOptions& options);
  virtual ~Worker() = default;
  // Trains to the end, from the rank's clock in the job (RegisterReply.
  // start_clock: a job restored from a checkpoint resumes at its clock, a
  // replacement of a lost worker where its predecessor stopped), skipping
  // the batches before it, then leaves the job as finished.
  // kDeadlineExceeded if the job stalls, kAborted if it failed, kCancelled
  // after RequestStop (having left the job unfinished, see Leave), other
  // errors from the servers or the scheduler.
  virtual absl::Status Run() = 0;
  // Makes Run stop before its next step, report the clock it reached and
  // leave the job unfinished (thread-safe; e.g. on SIGTERM).
  virtual void RequestStop() = 0;
  // Leaves the job unfinished at once, from any thread while Run() runs
  // (SIGTERM when the step under way does not end): the iteration in
  // progress is abandoned, the last clock report is sent (within
  // `timeout`) and the scheduler marks this worker LEFT at once, so that
  // its rank waits for a replacement. Run() must not be relied on
  // afterwards: the caller exits. The scheduler's errors.
  virtual absl::Status Leave(const std::string& reason,
                             absl::Duration timeout) = 0;
};

}  // namespace downpour

#endif  // DOWNPOUR_WORKER_WORKER_H_
