// ASP with pipelining (dense models, n_fetch = n_push = 1): one PushPull
// per table per step, computing the next step while it is in flight.
#include <vector>

#include "absl/time/clock.h"
#include "common/logging.h"
#include "common/status_macros.h"
#include "worker/internal/training_loop.h"
#include "worker/slowdown.h"

namespace downpour {
namespace {

class AspPipelinedLoop final : public TrainingLoop {
 public:
  AspPipelinedLoop(StepContext* ctx, DenseReplica* replica)
      : ctx_(*ctx), replica_(*replica) {}

  // Step c computes on the parameters returned by step c - 2's PushPull
  // while step c - 1's PushPull is on the wire: communication hides behind
  // computation, for one step more of staleness, which ASP allows. Two
  // gradient buffers alternate (one being sent while the next is written),
  // and two parameter buffers swap when a PushPull lands. No per-step
  // allocation besides the mini-batch indices.
  absl::Status Run() override {
    const WorkerOptions& o = ctx_.options();
    Client& client = ctx_.client();
    const int rank = ctx_.rank();
    std::vector<float>& params = replica_.params();
    const std::vector<ParamBlock>& blocks = replica_.blocks();
    std::vector<float> next(params.size());
    std::vector<float> grads[2] = {std::vector<float>(params.size()),
                                   std::vector<float>(params.size())};
    std::vector<Ticket> in_flight;
    int64_t in_flight_clock = -1;
    double in_flight_loss = 0;
    DP_ASSIGN_OR_RETURN(std::unique_ptr<ExampleStream> stream,
                        ctx_.Examples(replica_.train().num_examples, rank));
    std::vector<int> batch;
    uint64_t examples = 0;
    // Completes step `clock`: its PushPull is acknowledged and its values
    // become the parameters; rank 0 evaluates on schedule.
    auto land = [&](int64_t clock, double loss) -> absl::Status {
      absl::Status status;
      for (Ticket t : in_flight) {
        absl::Status s = client.Wait(t);
        if (status.ok()) status = s;
      }
      in_flight.clear();
      DP_RETURN_IF_ERROR(status);
      params.swap(next);
      DP_ASSIGN_OR_RETURN(
          const double test_accuracy,
          replica_.MaybeEvaluate(clock, loss, /*pull_first=*/false));
      return ctx_.FinishStep(clock, loss, examples, test_accuracy);
    };

    client.SetWorkerClock(rank, ctx_.start_clock());
    DP_RETURN_IF_ERROR(replica_.PullParams());
    for (int64_t clock = ctx_.start_clock(); clock < o.steps; ++clock) {
      DP_RETURN_IF_ERROR(ctx_.CheckStop(clock));
      std::vector<float>& g = grads[clock % 2];
      DP_RETURN_IF_ERROR(stream->Next(o.batch, &batch));
      const absl::Time start = absl::Now();
      const double loss = replica_.model().LossAndGradient(
          params.data(), replica_.train(), batch, g.data());
      StretchStep(start, o.slow_factor);
      examples += batch.size();
      if (in_flight_clock >= 0) {
        DP_RETURN_IF_ERROR(land(in_flight_clock, in_flight_loss));
      }
      client.SetWorkerClock(rank, clock);
      size_t off = 0;
      for (size_t i = 0; i < blocks.size(); ++i) {
        const size_t n = blocks[i].rows * blocks[i].width;
        in_flight.push_back(client.PushPull(
            replica_.tables()[i], Keys::Range(0, blocks[i].rows),
            absl::MakeConstSpan(g.data() + off, n),
            absl::MakeSpan(next.data() + off, n)));
        off += n;
      }
      in_flight_clock = clock;
      in_flight_loss = loss;
    }
    if (in_flight_clock >= 0) {
      DP_RETURN_IF_ERROR(land(in_flight_clock, in_flight_loss));
    }
    DP_LOG(INFO) << "done: " << examples << " examples (ASP, pipelined), max "
                 << "staleness " << client.max_staleness();
    return absl::OkStatus();
  }

 private:
  StepContext& ctx_;
  DenseReplica& replica_;
};

}  // namespace

std::unique_ptr<TrainingLoop> NewAspPipelinedLoop(StepContext* ctx,
                                                  DenseReplica* replica) {
  return std::make_unique<AspPipelinedLoop>(ctx, replica);
}

}  // namespace downpour
