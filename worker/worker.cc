#include "worker/worker.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "client/client.h"
#include "client/job_member.h"
#include "common/grpc_server.h"
#include "common/logging.h"
#include "common/status_macros.h"
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

class WorkerImpl final : public Worker {
 public:
  explicit WorkerImpl(const WorkerOptions& o) : options_(o) {}
  ~WorkerImpl() override {
    if (health_.server != nullptr) {
      health_.server->Shutdown(gpr_now(GPR_CLOCK_MONOTONIC));
    }
  }

  absl::Status Init() {
    if (!options_.health_listen.empty()) {
      DP_ASSIGN_OR_RETURN(StartedGrpcServer started,
                          StartGrpcServer(options_.health_listen, nullptr,
                                          "worker health service",
                                          /*ready=*/false));
      health_ = std::move(started);
    }
    JobMemberOptions mo;
    mo.scheduler_address = options_.scheduler_address;
    mo.name = options_.name;
    mo.rank = options_.rank;
    mo.job_token = options_.job_token;
    mo.auth = options_.auth;
    DP_ASSIGN_OR_RETURN(member_, JobMember::Join(mo));
    if (health_.health != nullptr) health_.health->SetReady(true);
    const ConsistencyPolicy& policy = member_->policy();
    SetLogTag(absl::StrCat("worker ", member_->rank()));
    DP_LOG(INFO) << "registered as node " << member_->node_id() << ", rank "
                 << member_->rank() << " of " << policy.total_workers()
                 << ", consistency " << policy.ToString();
    DP_RETURN_IF_ERROR(CheckOptions(options_, policy));

    ClientOptions co;
    co.scheduler_address = options_.scheduler_address;
    co.auth = options_.auth;
    co.op_timeout = absl::Seconds(60);
    DP_ASSIGN_OR_RETURN(client_, Client::Connect(co));
    ctx_ =
        std::make_unique<StepContext>(options_, member_.get(), client_.get());

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
    // The last clock reaches the scheduler before Run returns.
    absl::Status flushed = member_->Flush(absl::Seconds(30));
    return s.ok() ? flushed : s;
  }

 private:
  const WorkerOptions options_;
  // Declared in the order they are built: destroyed loop first, the
  // membership (heartbeats) last; the health service (options_
  // .health_listen) is shut down by the destructor's body.
  StartedGrpcServer health_;
  std::unique_ptr<JobMember> member_;
  std::unique_ptr<Client> client_;
  std::unique_ptr<StepContext> ctx_;
  std::unique_ptr<DenseReplica> replica_;
  std::unique_ptr<TrainingLoop> loop_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<Worker>> Worker::Create(
    const WorkerOptions& options) {
  auto w = std::make_unique<WorkerImpl>(options);
  DP_RETURN_IF_ERROR(w->Init());
  return std::unique_ptr<Worker>(std::move(w));
}

}  // namespace downpour
