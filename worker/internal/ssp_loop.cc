// The gated dense loop: SSP, and ASP with Downpour's n_fetch / n_push.
// Each step passes the consistency gate, pulls (every n_fetch steps under
// ASP), computes, pushes (the sum of n_push steps' gradients under ASP)
// and reports its clock once the pushes are acknowledged.
#include <algorithm>
#include <vector>

#include "absl/time/clock.h"
#include "common/logging.h"
#include "common/status_macros.h"
#include "worker/internal/training_loop.h"
#include "worker/slowdown.h"

namespace downpour {
namespace {

class SspLoop final : public TrainingLoop {
 public:
  SspLoop(StepContext* ctx, DenseReplica* replica)
      : ctx_(*ctx), replica_(*replica) {}

  absl::Status Run() override {
    const WorkerOptions& o = ctx_.options();
    Client& client = ctx_.client();
    const int rank = ctx_.rank();
    std::vector<float>& params = replica_.params();
    std::vector<float> grads(params.size()), acc(params.size(), 0.0f);
    DP_ASSIGN_OR_RETURN(std::unique_ptr<ExampleStream> stream,
                        ctx_.Examples(replica_.train().num_examples, rank));
    std::vector<int> batch;
    uint64_t examples = 0;
    // Pulling or pushing less than every step is Downpour's ASP mode (the
    // worker refuses n_fetch, n_push > 1 under other policies).
    const bool asp = ctx_.policy().is_asp();

    for (int64_t clock = ctx_.start_clock(); clock < o.steps; ++clock) {
      DP_RETURN_IF_ERROR(ctx_.CheckStop(clock));
      bool done;
      DP_RETURN_IF_ERROR(ctx_.StartStep(&clock, &done));
      if (done) break;
      client.SetWorkerClock(rank, clock);
      if (!asp || clock % o.n_fetch == 0) {
        DP_RETURN_IF_ERROR(replica_.PullParams());
      }

      DP_RETURN_IF_ERROR(stream->Next(o.batch, &batch));
      const absl::Time start = absl::Now();
      const double loss = replica_.model().LossAndGradient(
          params.data(), replica_.train(), batch, grads.data());
      StretchStep(start, o.slow_factor);
      examples += batch.size();

      if (o.n_push <= 1) {
        DP_RETURN_IF_ERROR(replica_.PushGrads(grads));
      } else {
        for (size_t i = 0; i < grads.size(); ++i) acc[i] += grads[i];
        // The last step flushes what is left, so no gradient is lost.
        if ((clock + 1) % o.n_push == 0 || clock + 1 == o.steps) {
          DP_RETURN_IF_ERROR(replica_.PushGrads(acc));
          std::fill(acc.begin(), acc.end(), 0.0f);
        }
      }

      DP_ASSIGN_OR_RETURN(
          const double test_accuracy,
          replica_.MaybeEvaluate(clock, loss, /*pull_first=*/true));
      DP_RETURN_IF_ERROR(ctx_.FinishStep(clock, loss, examples, test_accuracy));
    }
    DP_LOG(INFO) << "done: " << examples << " examples, max staleness "
                 << client.max_staleness() << ", discarded pushes "
                 << client.discarded_pushes();
    return absl::OkStatus();
  }

 private:
  StepContext& ctx_;
  DenseReplica& replica_;
};

}  // namespace

std::unique_ptr<TrainingLoop> NewSspLoop(StepContext* ctx,
                                         DenseReplica* replica) {
  return std::make_unique<SspLoop>(ctx, replica);
}

}  // namespace downpour
