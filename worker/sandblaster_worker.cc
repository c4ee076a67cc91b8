#include "worker/sandblaster_worker.h"

#include <unistd.h>

#include <memory>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "client/client.h"
#include "common/grpc_channel.h"
#include "common/grpc_server.h"
#include "common/grpc_status.h"
#include "common/logging.h"
#include "common/status_macros.h"
#include "grpcpp/grpcpp.h"
#include "lbfgs/problem.h"
#include "proto/downpour.grpc.pb.h"
#include "worker/slowdown.h"

namespace downpour {
namespace {

class SandblasterWorker {
 public:
  explicit SandblasterWorker(const SandblasterWorkerOptions& o)
      : options_(o),
        stub_(proto::Sandblaster::NewStub(
            NewGrpcChannel(o.coordinator_address, o.auth))) {}

  absl::Status Run() {
    DP_RETURN_IF_ERROR(
        health_.Start(options_.health_listen, "worker health service"));
    ClientOptions co;
    co.scheduler_address = options_.scheduler_address;
    co.auth = options_.auth;
    DP_ASSIGN_OR_RETURN(client_, Client::Connect(co));
    health_.SetReady(true);
    absl::Time last_contact = absl::Now();
    while (true) {
      proto::GetTaskRequest req;
      req.set_worker(options_.name);
      req.set_wait_ms(1000);
      proto::TaskAssignment task;
      grpc::ClientContext ctx;
      Prepare(&ctx);
      const grpc::Status s = stub_->GetTask(&ctx, req, &task);
      if (!s.ok()) {
        // Waiting would not help a refused token.
        if (s.error_code() == grpc::StatusCode::UNAUTHENTICATED ||
            absl::Now() - last_contact > options_.coordinator_timeout) {
          return FromGrpcStatus(
              s, absl::StrCat("coordinator at ", options_.coordinator_address));
        }
        absl::SleepFor(absl::Milliseconds(200));
        continue;
      }
      last_contact = absl::Now();
      if (task.kind() == proto::TaskAssignment::DONE) {
        DP_LOG(INFO) << "job done after " << tasks_run_ << " tasks";
        return absl::OkStatus();
      }
      if (task.kind() == proto::TaskAssignment::WAIT) continue;
      absl::Status ran = RunTask(task);
      if (ran.ok()) {
        failed_in_a_row_ = 0;
        continue;
      }
      // A task of a coordinator that was lost or rolled the job back (its
      // round is not open on the servers), or one that met its ranges
      // being restored: the task is handed out again if it still matters,
      // so drop it. Anything else, or this too often, ends the worker.
      const bool stale =
          absl::IsFailedPrecondition(ran) || absl::IsDataLoss(ran);
      if (!stale || ++failed_in_a_row_ > kMaxStaleTasksInARow) {
        return Annotate(ran, absl::StrCat("task ", task.task_id(), " of round ",
                                          task.round()));
      }
      DP_LOG(WARNING) << "task " << task.task_id() << " of round "
                      << task.round() << " dropped: " << ran.message();
      absl::SleepFor(absl::Milliseconds(100) * failed_in_a_row_);
    }
  }

 private:
  // The deadline of one call to the coordinator.
  void Prepare(grpc::ClientContext* ctx) const {
    ctx->set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
  }
  absl::Status Prepare(const proto::SandblasterProblem& spec) {
    if (problem_ != nullptr &&
        spec.SerializeAsString() == spec_.SerializeAsString()) {
      return absl::OkStatus();
    }
    DP_LOG(INFO) << "loading problem " << spec.kind() << " ("
                 << spec.data_path() << ")";
    DP_ASSIGN_OR_RETURN(problem_, TaskProblem::Load(spec));
    spec_ = spec;
    DP_ASSIGN_OR_RETURN(Table table, client_->OpenTable(spec.table()));
    if (table.width != problem_->width() ||
        table.num_keys != problem_->num_keys() ||
        spec.x_vector() >= table.vectors.size() ||
        spec.g_vector() >= table.vectors.size()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "table '", spec.table(), "' does not match the problem"));
    }
    x_table_ = table;
    x_table_.vector = spec.x_vector();
    g_table_ = table;
    g_table_.vector = spec.g_vector();
    x_round_ = -1;
    return absl::OkStatus();
  }

  absl::Status RunTask(const proto::TaskAssignment& task) {
    DP_RETURN_IF_ERROR(Prepare(task.problem()));
    const absl::Time start = absl::Now();
    const uint32_t w = problem_->width();
    const std::vector<Key> keys = problem_->TaskKeys(task.begin(), task.end());
    absl::Span<const float> x;
    if (keys.empty()) {
      // Dense: every task of a round reads the same x; pull it once.
      if (x_round_ != task.round()) {
        x_.resize(problem_->num_keys() * w);
        DP_RETURN_IF_ERROR(
            client_->GetSync(x_table_, Keys::Range(0, problem_->num_keys()),
                             absl::MakeSpan(x_)));
        x_round_ = task.round();
      }
      x = x_;
      grad_.resize(x_.size());
    } else {
      xs_.resize(keys.size() * w);
      DP_RETURN_IF_ERROR(client_->GetSync(x_table_, keys, absl::MakeSpan(xs_)));
      x = xs_;
      grad_.resize(xs_.size());
    }
    const double loss =
        problem_->Compute(task.begin(), task.end(), x, absl::MakeSpan(grad_));
    ++tasks_run_;
    StretchStep(start, options_.slow_factor);
    if (options_.crash_at_task > 0 && tasks_run_ == options_.crash_at_task) {
      DP_LOG(WARNING) << "crashing in task " << task.task_id()
                      << " as asked (--crash_at_task)";
      _exit(3);
    }
    const Keys where =
        keys.empty() ? Keys::Range(0, problem_->num_keys()) : Keys(keys);
    DP_RETURN_IF_ERROR(client_->Wait(client_->AddOnce(
        g_table_, where, grad_, task.round(), task.task_id())));
    proto::TaskResult result;
    result.set_worker(options_.name);
    result.set_round(task.round());
    result.set_task_id(task.task_id());
    result.set_loss(loss);
    proto::TaskResultReply reply;
    grpc::ClientContext ctx;
    Prepare(&ctx);
    const grpc::Status s = stub_->FinishTask(&ctx, result, &reply);
    if (!s.ok()) {
      // The gradient is on the servers; the task will be handed out again
      // and its copy's add dropped there, so this is not fatal.
      DP_LOG(WARNING) << "cannot report task " << task.task_id() << ": "
                      << s.error_message();
    }
    return absl::OkStatus();
  }

  const SandblasterWorkerOptions options_;
  std::unique_ptr<proto::Sandblaster::Stub> stub_;
  std::unique_ptr<Client> client_;
  std::unique_ptr<TaskProblem> problem_;
  proto::SandblasterProblem spec_;
  Table x_table_, g_table_;
  int64_t x_round_ = -1;
  std::vector<float> x_, xs_, grad_;
  int tasks_run_ = 0;
  // Tasks dropped one after another (see Run); the bound keeps a worker
  // that cannot do anything from asking for ever.
  static constexpr int kMaxStaleTasksInARow = 20;
  int failed_in_a_row_ = 0;
  HealthEndpoint health_;  // with options_.health_listen
};

}  // namespace

absl::Status RunSandblasterWorker(const SandblasterWorkerOptions& options) {
  if (options.coordinator_address.empty()) {
    return absl::InvalidArgumentError("--job=lbfgs needs --coordinator");
  }
  SandblasterWorker worker(options);
  return worker.Run();
}

}  // namespace downpour
