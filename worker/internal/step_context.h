// What every training loop of ps_worker shares: its options, its
// membership of the job, the data-plane client, and the two ends of an
// iteration: the consistency gate before it and the clock report after.
// Private to worker/.
//
// Thread-safe as far as JobMember and Client are: Hogwild threads share
// one StepContext (only thread 0 reports).
#ifndef DOWNPOUR_WORKER_INTERNAL_STEP_CONTEXT_H_
#define DOWNPOUR_WORKER_INTERNAL_STEP_CONTEXT_H_

#include <cstdint>

#include "absl/status/status.h"
#include "client/client.h"
#include "client/job_member.h"
#include "consistency/consistency.h"
#include "worker/worker.h"

namespace downpour {

class StepContext {
 public:
  // `member` and `client` must outlive this object.
  StepContext(const WorkerOptions& options, JobMember* member, Client* client)
      : options_(options), member_(member), client_(client) {}

  const WorkerOptions& options() const { return options_; }
  const ConsistencyPolicy& policy() const { return member_->policy(); }
  int rank() const { return member_->rank(); }
  JobMember& member() const { return *member_; }
  Client& client() const { return *client_; }

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

 private:
  const WorkerOptions& options_;
  JobMember* const member_;
  Client* const client_;
};

}  // namespace downpour

#endif  // DOWNPOUR_WORKER_INTERNAL_STEP_CONTEXT_H_
