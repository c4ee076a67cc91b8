#include "worker/internal/step_context.h"

#include "common/status_macros.h"

namespace downpour {

absl::Status StepContext::StartStep(int64_t* clock, bool* done) {
  *done = false;
  DP_ASSIGN_OR_RETURN(const Clock gating,
                      member_->WaitClock(*clock, absl::Minutes(2)));
  // With backups the gate is the N-th fastest clock: a worker behind it
  // would only send pushes the servers drop as late.
  if (policy().backup_workers > 0 && gating > *clock) *clock = gating;
  *done = *clock >= options_.steps;
  return absl::OkStatus();
}

absl::Status StepContext::FinishStep(int64_t clock, double loss,
                                     uint64_t examples, double test_accuracy) {
  ClockReport report;
  report.clock = clock + 1;
  report.loss = loss;
  report.examples = examples;
  report.test_accuracy = test_accuracy;
  report.max_staleness = client_->max_staleness();
  report.discarded = client_->discarded_pushes();
  return member_->ReportClock(report);
}

}  // namespace downpour
