#include "worker/internal/step_context.h"

#include "absl/strings/str_cat.h"
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

absl::StatusOr<std::unique_ptr<ExampleStream>> StepContext::Examples(
    int num_examples, int stream) const {
  std::unique_ptr<ExampleStream> s =
      ExampleStream::Create(*member_, options_.seed, num_examples, stream);
  // A seat's worker starts its stream where the seat began, not at 0.
  DP_RETURN_IF_ERROR(
      s->Skip(start_clock() - member_->first_clock(), options_.batch));
  return s;
}

absl::Status StepContext::CheckStop(int64_t clock) const {
  if (!stop_->load()) return absl::OkStatus();
  return absl::CancelledError(
      absl::StrCat("stopped on request before clock ", clock));
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
  {
    absl::MutexLock lock(&last_mu_);
    const double accuracy = last_.test_accuracy;
    last_ = report;
    if (test_accuracy < 0) last_.test_accuracy = accuracy;
  }
  return member_->ReportClock(report);
}

ClockReport StepContext::last_report() const {
  absl::MutexLock lock(&last_mu_);
  return last_;
}

}  // namespace downpour
