// Hogwild inside one worker (ASP, dense models): K threads take steps from
// a shared counter, each on its own mini-batches and gradient buffer, and
// all pull into the replica's ONE parameter array and read it while the
// others' pulls overwrite it, without locks: deliberate data races on
// plain floats (see worker.h for why that is sound here).
#include <atomic>
#include <thread>
#include <tuple>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/logging.h"
#include "common/status_macros.h"
#include "worker/example_stream.h"
#include "worker/internal/training_loop.h"

namespace downpour {
namespace {

class HogwildLoop final : public TrainingLoop {
 public:
  // A resumed job starts counting at its start clock (Hogwild's batches
  // never repeat anyway).
  HogwildLoop(StepContext* ctx, DenseReplica* replica)
      : ctx_(*ctx),
        replica_(*replica),
        next_(ctx->start_clock()),
        completed_(ctx->start_clock()) {}

  absl::Status Run() override {
    const WorkerOptions& o = ctx_.options();
    const int k = o.hogwild_threads;
    if (ExampleStream::SplitsEpochs(ctx_.policy())) {
      shared_stream_ = ExampleStream::Create(ctx_.member(), o.seed,
                                             replica_.train().num_examples, 0);
    }
    std::vector<absl::Status> status(k);
    std::vector<std::thread> threads;
    for (int t = 0; t < k; ++t) {
      threads.emplace_back([this, t, &status] {
        status[t] = Body(t);
        if (!status[t].ok()) failed_.store(true);
      });
    }
    for (auto& th : threads) th.join();
    for (int t = 0; t < k; ++t) {
      if (!status[t].ok()) {
        return absl::Status(
            status[t].code(),
            absl::StrCat("hogwild thread ", t, ": ", status[t].message()));
      }
    }
    double accuracy = -1;
    if (ctx_.rank() == 0) {
      DP_RETURN_IF_ERROR(replica_.PullParams());
      double test_loss;
      std::tie(accuracy, test_loss) = replica_.Evaluate();
      DP_LOG(INFO) << "clock " << o.steps << ": test accuracy " << accuracy
                   << ", test loss " << test_loss;
    }
    DP_RETURN_IF_ERROR(
        ctx_.FinishStep(o.steps - 1, 0, examples_.load(), accuracy));
    DP_LOG(INFO) << "done: " << examples_.load() << " examples on " << k
                 << " hogwild threads (steps per thread: "
                 << absl::StrJoin(taken_, ", ") << ")";
    return absl::OkStatus();
  }

 private:
  // Thread t's share of the steps. Steps are handed out from one counter;
  // `completed_` counts the finished ones, and only thread 0 reports them
  // to the scheduler, so that the reported clock never moves back.
  absl::Status Body(int t) {
    const WorkerOptions& o = ctx_.options();
    std::vector<float> grads(replica_.params().size());
    // Writes to the parameters (PullParams) and reads of them
    // (LossAndGradient) race across threads on purpose.
    const float* const shared = replica_.params().data();
    // Distinct batches per thread; one stream for all of them when the
    // job splits epochs over its workers (each example once an epoch).
    std::unique_ptr<ExampleStream> own;
    if (shared_stream_ == nullptr) {
      own = ExampleStream::Create(ctx_.member(), o.seed,
                                  replica_.train().num_examples,
                                  ctx_.rank() * o.hogwild_threads + t);
    }
    ExampleStream& stream = own != nullptr ? *own : *shared_stream_;
    std::vector<int> batch;
    while (!failed_.load(std::memory_order_relaxed)) {
      const int64_t step = next_.fetch_add(1);
      if (step >= o.steps) break;
      DP_RETURN_IF_ERROR(ctx_.CheckStop(step));
      ctx_.client().SetWorkerClock(ctx_.rank(), step);
      DP_RETURN_IF_ERROR(replica_.PullParams());
      DP_RETURN_IF_ERROR(stream.Next(o.batch, &batch));
      const double loss = replica_.model().LossAndGradient(
          shared, replica_.train(), batch, grads.data());
      DP_RETURN_IF_ERROR(replica_.PushGrads(grads));
      examples_.fetch_add(batch.size());
      const int64_t done = completed_.fetch_add(1) + 1;
      ++taken_[t];  // each thread its own element
      if (t == 0 && done < o.steps) {
        DP_RETURN_IF_ERROR(
            ctx_.FinishStep(done - 1, loss, examples_.load(), -1));
      }
    }
    return absl::OkStatus();
  }

  StepContext& ctx_;
  DenseReplica& replica_;
  std::unique_ptr<ExampleStream> shared_stream_;  // epoch splits only
  std::atomic<int64_t> next_, completed_;
  std::atomic<uint64_t> examples_{0};
  std::atomic<bool> failed_{false};
  std::vector<int64_t> taken_ =
      std::vector<int64_t>(ctx_.options().hogwild_threads, 0);
};

}  // namespace

std::unique_ptr<TrainingLoop> NewHogwildLoop(StepContext* ctx,
                                             DenseReplica* replica) {
  return std::make_unique<HogwildLoop>(ctx, replica);
}

}  // namespace downpour
