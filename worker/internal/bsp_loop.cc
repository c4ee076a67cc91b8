// BSP for dense models: one PushPull round trip per step, overlapped with
// the backward pass (docs/ARCHITECTURE.md, "BSP with PushPull").
#include <algorithm>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/logging.h"
#include "common/status_macros.h"
#include "models/learning_rate.h"
#include "worker/bsp_parts.h"
#include "worker/internal/training_loop.h"
#include "worker/slowdown.h"

namespace downpour {
namespace {

class BspLoop final : public TrainingLoop {
 public:
  BspLoop(StepContext* ctx, DenseReplica* replica)
      : ctx_(*ctx), replica_(*replica) {}

  // Each range of the gradient goes out as a PushPull as soon as the model
  // has finished it (the last layer first, then the first layer's weights
  // in row ranges while the rest of them are computed), and each server
  // answers once that range's update of the step is applied (with N
  // workers, when the N-th gradient of the step arrives), with the values
  // step c + 1 must start from. They land straight in the parameters: the
  // model reads no parameter of a range after reporting it. If every part
  // was applied, all N workers' gradients of step c are in, which is
  // exactly what the gate for c + 1 asks, so no pull and no WaitClock
  // follow. A backup worker whose push came late (discarded) asks the
  // scheduler and pulls instead.
  absl::Status Run() override {
    const WorkerOptions& o = ctx_.options();
    Client& client = ctx_.client();
    const int rank = ctx_.rank();
    const int n = ctx_.policy().num_workers;
    std::vector<float>& params = replica_.params();
    const std::vector<Table>& tables = replica_.tables();
    std::vector<float> grads(params.size());
    BspPartTracker parts(CutBspParts(replica_.blocks()));
    std::vector<Ticket> tickets;
    DP_ASSIGN_OR_RETURN(std::unique_ptr<ExampleStream> stream,
                        ctx_.Examples(replica_.train().num_examples, rank));
    std::vector<int> batch;
    uint64_t examples = 0;
    int64_t params_clock = -1;  // params hold the state step params_clock reads
    // Where a step's time goes, for the log line at the end.
    absl::Duration compute_time, exchange_time;
    for (int64_t clock = ctx_.start_clock(); clock < o.steps; ++clock) {
      DP_RETURN_IF_ERROR(ctx_.CheckStop(clock));
      // Without the state of step `clock` (first step, or a late backup
      // worker): pass the gate (which may skip ahead) and pull.
      const bool pull = params_clock != clock;
      if (pull) {
        bool done;
        DP_RETURN_IF_ERROR(ctx_.StartStep(&clock, &done));
        if (done) break;
      }
      client.SetWorkerClock(rank, clock);
      if (pull) DP_RETURN_IF_ERROR(replica_.PullParams());
      const float lr = BspLearningRate(o.lr, n, o.warmup_steps, clock, o.steps,
                                       o.lr_decay_from);
      const uint64_t discarded_before = client.discarded_pushes();
      const uint64_t requests_before = client.traffic().requests;
      tickets.clear();
      parts.Reset();
      auto send = [&](const BspPart& p) {
        for (size_t j = p.offset; j < p.offset + p.count; ++j) grads[j] *= lr;
        tickets.push_back(client.PushPull(
            tables[p.table], Keys::Range(p.begin, p.end),
            absl::MakeConstSpan(grads.data() + p.offset, p.count),
            absl::MakeSpan(params.data() + p.offset, p.count)));
      };
      // Sends every part that the range [off, off + count) completes.
      auto ready = [&](size_t off, size_t count) {
        parts.Ready(off, count, send);
      };

      DP_RETURN_IF_ERROR(stream->Next(o.batch, &batch));
      const absl::Time start = absl::Now();
      double loss;
      if (o.slow_factor > 1.0) {
        // A simulated straggler must not send before its (slow) step ends.
        loss = replica_.model().LossAndGradient(params.data(), replica_.train(),
                                                batch, grads.data());
        StretchStep(start, o.slow_factor);
        ready(0, grads.size());
      } else {
        loss = replica_.model().LossAndGradientStreamed(
            params.data(), replica_.train(), batch, grads.data(), ready);
      }
      examples += batch.size();
      const absl::Time computed = absl::Now();
      compute_time += computed - start;
      absl::Status status;
      if (tickets.size() != parts.parts().size()) {
        status = absl::InternalError(
            absl::StrCat("the model reported ", tickets.size(), " of ",
                         parts.parts().size(), " gradient parts"));
      }
      for (Ticket t : tickets) {
        absl::Status s = client.Wait(t);
        if (status.ok()) status = s;
      }
      DP_RETURN_IF_ERROR(status);
      exchange_time += absl::Now() - computed;
      const uint64_t discarded = client.discarded_pushes() - discarded_before;
      const uint64_t sent = client.traffic().requests - requests_before;
      const bool late = discarded != 0;
      params_clock = late ? -1 : clock + 1;
      if (late && ctx_.policy().backup_workers == 0 && discarded < sent) {
        // Without backup workers only a replacement whose predecessor died
        // between two sends of this step gets here (its clock report may
        // lag a step behind what it sent): the late parts took the step
        // with the predecessor's gradient, and this worker's gradient of
        // the others was computed on parameters in which those parts
        // already had.
        DP_LOG(WARNING) << "step " << clock << ": " << discarded << " of "
                        << sent << " gradient pushes came late (the lost "
                        << "worker had sent those parts); the others were "
                        << "computed on partly updated parameters, so this "
                        << "step is not bit for bit an undisturbed run's";
      }

      DP_ASSIGN_OR_RETURN(
          const double test_accuracy,
          replica_.MaybeEvaluate(clock, loss, /*pull_first=*/late));
      DP_RETURN_IF_ERROR(ctx_.FinishStep(clock, loss, examples, test_accuracy));
    }
    const double steps = std::max<double>(1, o.steps);
    DP_LOG(INFO) << "done: " << examples << " examples (BSP, PushPull), max "
                 << "staleness " << client.max_staleness()
                 << ", discarded pushes " << client.discarded_pushes()
                 << "; per step: compute (sends overlapped) "
                 << absl::ToDoubleMilliseconds(compute_time) / steps
                 << " ms, then waiting for the replies "
                 << absl::ToDoubleMilliseconds(exchange_time) / steps << " ms";
    return absl::OkStatus();
  }

 private:
  StepContext& ctx_;
  DenseReplica& replica_;
};

}  // namespace

std::unique_ptr<TrainingLoop> NewBspLoop(StepContext* ctx,
                                         DenseReplica* replica) {
  return std::make_unique<BspLoop>(ctx, replica);
}

}  // namespace downpour
