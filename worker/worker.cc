#include "worker/worker.h"

#include <atomic>
#include <utility>

#include "absl/strings/str_cat.h"
#include "client/client.h"
#include "client/job_member.h"
#include "client/traffic_metrics.h"
#include "common/grpc_server.h"
#include "common/logging.h"
#include "common/status_macros.h"
#include "metrics/registry.h"
#include "worker/internal/dense_replica.h"
#include "worker/internal/step_context.h"
#include "worker/internal/training_loop.h"

namespace downpour {
namespace {

// The options that depend on the job's policy: kInvalidArgument naming
// the option, the policy and the way out.
absl::Status CheckOptions(const WorkerOptions& o,
                          const ConsistencyPolicy& policy) {
  const bool lazy = o.n_fetch > 1 || o.n_push > 1;
  if (!policy.is_asp() && lazy) {
    return absl::InvalidArgumentError(absl::StrCat(
        "n_fetch ", o.n_fetch, " and n_push ", o.n_push,
        ": pulling or pushing less than every step is Downpour's ASP mode; "
        "the job's consistency is ",
        policy.ToString(), " (use --n_fetch=1 --n_push=1)"));
  }
  if (o.hogwild_threads > 1) {
    if (!policy.is_asp()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "hogwild_threads ", o.hogwild_threads,
          ": Hogwild threads update without locks or clocks and need ASP; "
          "the job's consistency is ",
          policy.ToString(), " (use --hogwild_threads=1)"));
    }
    if (o.model == "sparse_lr" || lazy) {
      return absl::InvalidArgumentError(
          "hogwild_threads > 1 needs a dense model (softmax, mlp) and "
          "n_fetch = n_push = 1");
    }
  }
  if (o.hogwild_threads < 1) {
    return absl::InvalidArgumentError("hogwild_threads must be >= 1");
  }
  if (o.threads < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("threads ", o.threads, ": must be >= 1"));
  }
  if (o.model == "sparse_lr" && lazy) {
    return absl::InvalidArgumentError(
        "sparse_lr pulls and pushes the keys of each batch: n_fetch and "
        "n_push must be 1");
  }
  return absl::OkStatus();
}

// This worker's figures: its progress as last reported to the scheduler,
// and its client's traffic. The names and the rank label are those of the
// scheduler's per-worker figures (scheduler/job_metrics.h): the same
// series, seen from the worker.
void WriteWorkerMetrics(int rank, const ClockReport& p,
                        const TrafficStats& traffic, MetricWriter* w) {
  const MetricLabels l = {{"rank", absl::StrCat(rank)}};
  w->Gauge("downpour_worker_clock", "Iterations the worker has completed", l,
           static_cast<double>(p.clock));
  w->Gauge("downpour_worker_loss", "Training loss the worker last reported", l,
           p.loss);
  w->Counter("downpour_worker_examples_total",
             "Training examples the worker has processed", l,
             static_cast<double>(p.examples));
  if (p.test_accuracy > 0) {
    w->Gauge("downpour_worker_test_accuracy",
             "Test accuracy the worker last evaluated", l, p.test_accuracy);
  }
  w->Gauge("downpour_worker_max_staleness",
           "Largest staleness (clocks) the worker's pulls have seen", l,
           static_cast<double>(p.max_staleness));
  w->Counter("downpour_worker_discarded_pushes_total",
             "The worker's pushes dropped as late (backup workers)", l,
             static_cast<double>(p.discarded));
  WriteClientTrafficMetrics(traffic, w);
}

class WorkerImpl final : public Worker {
 public:
  explicit WorkerImpl(const WorkerOptions& o) : options_(o) {}

  absl::Status Init() {
    DP_RETURN_IF_ERROR(
        health_.Start(options_.health_listen, "worker health service"));
    JobMemberOptions mo;
    mo.scheduler_address = options_.scheduler_address;
    mo.name = options_.name;
    mo.rank = options_.rank;
    mo.job_token = options_.job_token;
    mo.auth = options_.auth;
    // Long enough to wait out a restore of the job from a checkpoint, during
    // which the scheduler answers kUnavailable.
    mo.register_timeout = absl::Minutes(5);
    mo.on_job_failed = options_.on_job_failed;
    // psctl retire: stop between two steps, as on SIGTERM, then leave for
    // good (Run).
    mo.on_asked_to_leave = [this] { stop_requested_.store(true); };
    DP_ASSIGN_OR_RETURN(member_, JobMember::Join(mo));
    health_.SetReady(true);
    const ConsistencyPolicy& policy = member_->policy();
    SetLogTag(absl::StrCat("worker ", member_->rank()));
    DP_LOG(INFO) << "registered as node " << member_->node_id() << ", rank "
                 << member_->rank() << " of " << policy.total_workers()
                 << ", consistency " << policy.ToString()
                 << (member_->start_clock() > 0 || member_->restored_from() != 0
                         ? absl::StrCat(
                               ", resuming at clock ", member_->start_clock(),
                               member_->restored_from() != 0
                                   ? absl::StrCat(" (restored from checkpoint ",
                                                  member_->restored_from(), ")")
                               : member_->rank() >= policy.total_workers() &&
                                       member_->first_clock() ==
                                           member_->start_clock()
                                   ? " (an elastic seat: joining the "
                                     "running job)"
                                   : " (the rank's clock: replacing "
                                     "a lost worker)")
                         : "");
    DP_RETURN_IF_ERROR(CheckOptions(options_, policy));

    ClientOptions co;
    co.scheduler_address = options_.scheduler_address;
    co.auth = options_.auth;
    co.op_timeout = absl::Seconds(60);
    DP_ASSIGN_OR_RETURN(client_, Client::Connect(co));
    ctx_ = std::make_unique<StepContext>(options_, member_.get(), client_.get(),
                                         &stop_requested_);
    if (options_.metrics != nullptr) {
      metrics_ = options_.metrics->Add([this](MetricWriter* w) {
        WriteWorkerMetrics(member_->rank(), ctx_->last_report(),
                           client_->traffic(), w);
      });
    }

    if (options_.model == "sparse_lr") {
      DP_ASSIGN_OR_RETURN(loop_, NewSparseLoop(ctx_.get()));
      return absl::OkStatus();
    }
    DP_ASSIGN_OR_RETURN(replica_, DenseReplica::Create(ctx_.get()));
    if (options_.hogwild_threads > 1) {
      loop_ = NewHogwildLoop(ctx_.get(), replica_.get());
    } else if (policy.is_asp() && options_.n_fetch == 1 &&
               options_.n_push == 1) {
      loop_ = NewAspPipelinedLoop(ctx_.get(), replica_.get());
    } else if (policy.is_bsp()) {
      loop_ = NewBspLoop(ctx_.get(), replica_.get());
    } else {
      // SSP, and ASP with n_fetch or n_push > 1.
      loop_ = NewSspLoop(ctx_.get(), replica_.get());
    }
    return absl::OkStatus();
  }

  absl::Status Run() override {
    absl::Status s = loop_->Run();
    if (s.code() == absl::StatusCode::kCancelled && member_->asked_to_leave()) {
      // Retired by the operator: its last clock reaches the scheduler, then
      // the rank retires; nobody replaces it, so this is a clean end.
      DP_LOG(INFO) << "asked to leave the job for good (psctl retire): "
                   << "leaving at clock " << member_->reported_clock();
      return member_->LeaveForGood("retired by the operator", absl::Minutes(2));
    }
    if (s.code() == absl::StatusCode::kCancelled) {
      // Stopped between two steps (RequestStop: SIGTERM): the rank waits
      // for a replacement, which continues from the clock reported.
      absl::Status left = Leave("SIGTERM", absl::Seconds(10));
      if (!left.ok()) DP_LOG(ERROR) << "leaving the job: " << left;
      return s;
    }
    // After a failure what is queued is dropped, and the scheduler learns
    // of the end from the heartbeats stopping.
    DP_RETURN_IF_ERROR(s);
    // The last clock reaches the scheduler before Run returns (through a
    // scheduler restart too), and the scheduler learns at once that this
    // worker's end is no loss.
    return member_->Leave(/*finished=*/true, "finished its steps",
                          absl::Minutes(2));
  }

  absl::Status Leave(const std::string& reason,
                     absl::Duration timeout) override {
    DP_LOG(INFO) << reason << ": leaving the job, reporting clock "
                 << member_->reported_clock();
    return member_->Leave(/*finished=*/false, reason, timeout);
  }
  void RequestStop() override { stop_requested_.store(true); }

 private:
  const WorkerOptions options_;
  std::atomic<bool> stop_requested_{false};
  // Declared in the order they are built: destroyed loop first, the
  // membership (heartbeats) last.
  std::unique_ptr<JobMember> member_;
  std::unique_ptr<Client> client_;
  std::unique_ptr<StepContext> ctx_;
  std::unique_ptr<DenseReplica> replica_;
  std::unique_ptr<TrainingLoop> loop_;
  // Removed before anything its collector reads goes.
  MetricsRegistry::Registration metrics_;
  // Declared last: stops answering probes first (options_.health_listen).
  HealthEndpoint health_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<Worker>> Worker::Create(
    const WorkerOptions& options) {
  auto w = std::make_unique<WorkerImpl>(options);
  DP_RETURN_IF_ERROR(w->Init());
  return std::unique_ptr<Worker>(std::move(w));
}

}  // namespace downpour
