// What every training loop of ps_worker shares: its options, its
// membership of the job, the data-plane client, and the two ends of an
// iteration: the consistency gate before it and the clock report after.
// Private to worker/.
//
// Thread-safe as far as JobMember and Client are: Hogwild threads share
// one StepContext (only thread 0 reports).
#ifndef DOWNPOUR_WORKER_INTERNAL_STEP_CONTEXT_H_
#define DOWNPOUR_WORKER_INTERNAL_STEP_CONTEXT_H_

#include <atomic>
#include <cstdint>
#include <memory>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "client/client.h"
#include "client/job_member.h"
#include "consistency/consistency.h"
#include "worker/example_stream.h"
#include "worker/worker.h"

namespace downpour {

class StepContext {
 public:
  // `member`, `client` and `stop` must outlive this object; once *stop is
  // true, CheckStop fails.
  StepContext(const WorkerOptions& options, JobMember* member, Client* client,
              const std::atomic<bool>* stop)
      : options_(options), member_(member), client_(client), stop_(stop) {}

  const WorkerOptions& options() const { return options_; }
  const ConsistencyPolicy& policy() const { return member_->policy(); }
  int rank() const { return member_->rank(); }
  // The data shard this worker trains on, of policy().total_workers(), in
  // a job without elastic seats: its rank's. (A job with seats draws from
  // epoch splits of the whole set instead: worker/example_stream.h.)
  int data_shard() const { return rank() % policy().total_workers(); }
  JobMember& member() const { return *member_; }
  Client& client() const { return *client_; }

  // The iteration to start from (JobMember::start_clock): 0, the clock of
  // the checkpoint the job was restored from, or where a lost worker of
  // this rank stopped. A loop runs [start_clock(), steps).
  int64_t start_clock() const { return member_->start_clock(); }
  // The job was restored or resumed, or this worker replaces a lost one in
  // a running job (even one lost before its first clock report: the job
  // had passed "init-params"): the tables hold trained values, which rank
  // 0 must not overwrite with initial ones, and nobody else will wait at
  // the start-up barrier.
  bool resumed() const {
    return member_->start_clock() > 0 || member_->restored_from() != 0 ||
           member_->BarrierPassed(kInitBarrier);
  }
  // Where the workers wait until rank 0 has written the initial values.
  static constexpr char kInitBarrier[] = "init-params";
  // The batches a loop draws from `num_examples` (the replica's train()),
  // as stream `stream` of a fixed shard (worker/example_stream.h). A
  // resumed job (or a replacement, on its predecessor's stream) has drawn
  // and dropped the batches of its rank's clocks before start_clock() (from
  // first_clock(): a worker taking a new seat drops none), so that it goes
  // on as if it had not stopped.
  absl::StatusOr<std::unique_ptr<ExampleStream>> Examples(int num_examples,
                                                          int stream) const;
  // kCancelled once a stop was requested (Worker::RequestStop: SIGTERM):
  // loops check it before each iteration, so they stop between two.
  absl::Status CheckStop(int64_t clock) const;

  // The consistency gate before iteration *clock: returns once the policy
  // lets it proceed (kDeadlineExceeded after two minutes). A backup worker
  // that fell behind skips ahead to the step being taken (*clock moves);
  // *done is set when that skip passes the last step.
  absl::Status StartStep(int64_t* clock, bool* done);
  // Completes iteration `clock` (its pushes acknowledged): queues the
  // clock report clock + 1 with the progress figures and this client's
  // staleness and discard counts. test_accuracy < 0: not evaluated.
  // Returns the first error an earlier report got.
  absl::Status FinishStep(int64_t clock, double loss, uint64_t examples,
                          double test_accuracy);

  // The report FinishStep last queued, with the last test accuracy
  // evaluated (for metrics scrapes, from any thread).
  ClockReport last_report() const ABSL_LOCKS_EXCLUDED(last_mu_);

 private:
  const WorkerOptions& options_;
  JobMember* const member_;
  Client* const client_;
  const std::atomic<bool>* const stop_;
  mutable absl::Mutex last_mu_;
  ClockReport last_ ABSL_GUARDED_BY(last_mu_);
};

}  // namespace downpour

#endif  // DOWNPOUR_WORKER_INTERNAL_STEP_CONTEXT_H_
