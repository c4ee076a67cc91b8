#include "lbfgs/coordinator.h"

#include <numeric>
#include <optional>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "client/vector_op.h"
#include "cluster/scheduler_client.h"
#include "common/error_reason.h"
#include "common/grpc_server.h"
#include "common/grpc_status.h"
#include "common/logging.h"
#include "common/status_macros.h"
#include "grpcpp/grpcpp.h"
#include "proto/downpour.grpc.pb.h"

namespace downpour {
namespace {

// Vectors on the servers.
class ServerVectorSpace final : public VectorSpace {
 public:
  ServerVectorSpace(Client* client, Table table)
      : client_(client), table_(std::move(table)) {}
  absl::StatusOr<std::vector<double>> Run(
      const proto::VectorCommand& command) override {
    return VectorOp(*client_, table_, command);
  }

 private:
  Client* client_;
  const Table table_;
};

// The data term, computed by the workers through the task pool.
class TaskObjective final : public Objective {
 public:
  TaskObjective(TaskPool* pool,
                std::vector<std::pair<uint64_t, uint64_t>> tasks,
                absl::Duration timeout)
      : pool_(pool), tasks_(std::move(tasks)), timeout_(timeout) {}
  absl::StatusOr<double> Evaluate(int64_t round) override {
    DP_ASSIGN_OR_RETURN(std::vector<double> losses,
                        pool_->RunRound(round, tasks_, timeout_));
    // Task order, as the reference adds them.
    double sum = 0;
    for (double l : losses) sum += l;
    return sum;
  }

 private:
  TaskPool* pool_;
  const std::vector<std::pair<uint64_t, uint64_t>> tasks_;
  const absl::Duration timeout_;
};

class CoordinatorImpl final : public Coordinator,
                              public proto::Sandblaster::Service {
 public:
  explicit CoordinatorImpl(const CoordinatorOptions& o)
      : options_(o), pool_(o.backup_tasks, o.task_lease) {}
  ~CoordinatorImpl() override { Shutdown(); }

  absl::Status Init() {
    DP_ASSIGN_OR_RETURN(problem_, TaskProblem::Load(options_.problem),
                        "load the problem");
    if (options_.resume) {
      // Before the table is declared: a restore drops tables the
      // checkpoint lacks, and brings this one back as it holds it.
      DP_ASSIGN_OR_RETURN(resume_, RestoreNewestState(), "resume");
    }
    ClientOptions co;
    co.scheduler_address = options_.scheduler_address;
    co.auth = options_.auth;
    DP_ASSIGN_OR_RETURN(client_, Client::Connect(co));
    TableOptions t;
    t.name = options_.table;
    t.width = problem_->width();
    t.num_keys = problem_->num_keys();
    t.handler = "assign";  // nothing pushes: the algebra runs as commands
    t.vectors = LbfgsVectors::Names(options_.lbfgs.history);
    DP_ASSIGN_OR_RETURN(table_, client_->CreateTable(t));
    spec_ = options_.problem;
    spec_.set_table(options_.table);
    spec_.set_num_examples(problem_->num_examples());
    spec_.set_x_vector(LbfgsVectors::kX);
    spec_.set_g_vector(LbfgsVectors::kG);
    if (spec_.kind() == "sparse_lr")
      spec_.set_num_features(problem_->num_keys());

    DP_ASSIGN_OR_RETURN(StartedGrpcServer started,
                        StartGrpcServer(options_.listen_address, this,
                                        "the task service", options_.auth));
    health_ = std::move(started.health);
    server_ = std::move(started.server);
    port_ = started.port;
    const std::string host =
        options_.listen_address.substr(0, options_.listen_address.rfind(':'));
    address_ = absl::StrCat(host, ":", port_);
    DP_LOG(INFO) << "coordinator serving tasks on " << address_ << ": "
                 << problem_->num_examples() << " examples, "
                 << problem_->num_keys() << " keys x " << problem_->width()
                 << ", " << options_.tasks << " tasks per evaluation, backups "
                 << (options_.backup_tasks ? "on" : "off");
    return absl::OkStatus();
  }

  std::string address() const override { return address_; }

  absl::StatusOr<LbfgsResult> Run(
      const std::function<void(const IterationRecord&)>& on_iteration)
      override {
    ServerVectorSpace space(client_.get(), table_);
    TaskObjective objective(
        &pool_, SplitTasks(problem_->num_examples(), options_.tasks),
        options_.evaluation_timeout);
    LbfgsOptions lo = options_.lbfgs;
    lo.regularized_keys = problem_->RegularizedKeys();
    // While a round waits for the workers, watch the table: a range with no
    // live server (replicas 1, or every holder gone) ends the job at once,
    // naming the server, instead of after the evaluation timeout.
    absl::Notification done;
    std::thread watch([&] {
      while (!done.WaitForNotificationWithTimeout(absl::Milliseconds(200))) {
        absl::Status health = client_->CheckTable(table_);
        if (!health.ok()) {
          DP_LOG(ERROR) << "the job cannot go on: " << health;
          pool_.Abort(health);
          return;
        }
      }
    });
    LbfgsRunControl control;
    control.on_iteration = on_iteration;
    control.resume = resume_;
    // Above every round a lost coordinator may have opened: it opened at
    // most one per evaluation, far fewer than the microseconds it ran. (A
    // stale worker's gradient for a reopened round would be counted.)
    control.min_round = absl::ToUnixMicros(absl::Now());
    control.save_every = options_.checkpoint_every_iterations;
    control.save = [&](proto::LbfgsState state) {
      state.set_table(options_.table);
      SaveState(state);
      return absl::OkStatus();
    };
    auto result = MinimizeLbfgs(&space, &objective, lo, control);
    done.Notify();
    watch.join();
    pool_.Close();
    // A busy worker asks again when its task ends (a slow one after some
    // seconds); one silent for longer than a lease is presumed dead.
    pool_.WaitForWorkersToLeave(std::min(options_.task_lease, absl::Seconds(5)),
                                absl::Seconds(30));
    return result;
  }

  absl::StatusOr<std::pair<double, double>> EvaluateHeldOut() override {
    std::vector<float> x(problem_->num_keys() * problem_->width());
    DP_RETURN_IF_ERROR(client_->GetSync(
        table_, Keys::Range(0, problem_->num_keys()), absl::MakeSpan(x)));
    return problem_->Evaluate(x);
  }

  TaskStats task_stats() const override { return pool_.stats(); }
  TrafficStats traffic() const override { return client_->traffic(); }

  void Shutdown() override {
    pool_.Close();
    if (server_ != nullptr) {
      server_->Shutdown(absl::ToChronoTime(absl::Now() + absl::Seconds(2)));
      server_.reset();
    }
  }

  // proto::Sandblaster::Service
  grpc::Status GetTask(grpc::ServerContext* ctx,
                       const proto::GetTaskRequest* req,
                       proto::TaskAssignment* reply) override {
    const absl::Duration wait =
        std::min(absl::Milliseconds(std::max<int64_t>(req->wait_ms(), 0)),
                 absl::Seconds(5));
    TaskPool::Assignment a = pool_.Next(req->worker(), wait);
    switch (a.kind) {
      case TaskPool::Assignment::kDone:
        reply->set_kind(proto::TaskAssignment::DONE);
        break;
      case TaskPool::Assignment::kWait:
        reply->set_kind(proto::TaskAssignment::WAIT);
        break;
      case TaskPool::Assignment::kRun:
        reply->set_kind(proto::TaskAssignment::RUN);
        reply->set_round(a.round);
        reply->set_task_id(a.task);
        reply->set_begin(a.begin);
        reply->set_end(a.end);
        reply->set_backup(a.backup);
        *reply->mutable_problem() = spec_;
        break;
    }
    return grpc::Status::OK;
  }

  grpc::Status FinishTask(grpc::ServerContext* ctx,
                          const proto::TaskResult* req,
                          proto::TaskResultReply* reply) override {
    reply->set_counted(pool_.Finish(req->round(), req->task_id(), req->loss()));
    return grpc::Status::OK;
  }

 private:
  SchedulerClient Scheduler(absl::Duration rpc_timeout) const {
    return SchedulerClient(options_.scheduler_address, rpc_timeout,
                           options_.auth);
  }

  // Rolls the job back to the newest complete checkpoint that holds an
  // L-BFGS state of this table, and returns that state (nullopt: none,
  // start afresh).
  absl::StatusOr<std::optional<proto::LbfgsState>> RestoreNewestState() {
    SchedulerClient sched = Scheduler(absl::Seconds(10));
    absl::StatusOr<std::vector<proto::CheckpointManifest>> all;
    // The scheduler may still be starting (a restart of the whole job).
    const absl::Time deadline = absl::Now() + absl::Minutes(1);
    while (!(all = sched.ListCheckpoints()).ok() &&
           absl::IsUnavailable(all.status()) && absl::Now() < deadline) {
      absl::SleepFor(absl::Milliseconds(500));
    }
    if (!all.ok()) return all.status();
    const proto::CheckpointManifest* newest = nullptr;
    for (const auto& m : *all) {  // oldest first
      if (m.lbfgs().table() == options_.table) newest = &m;
    }
    if (newest == nullptr) {
      DP_LOG(INFO) << "no checkpoint holds an L-BFGS state of table '"
                   << options_.table << "': starting at iteration 0";
      return std::nullopt;
    }
    // Checked before anything is rolled back: a run of another problem
    // or history could not use the state.
    const proto::LbfgsState& state = newest->lbfgs();
    const proto::TableSpec* spec = nullptr;
    for (const auto& t : newest->tables()) {
      if (t.spec().name() == options_.table) spec = &t.spec();
    }
    if (state.history() != options_.lbfgs.history || spec == nullptr ||
        spec->num_keys() != problem_->num_keys() ||
        spec->width() != problem_->width()) {
      return absl::FailedPreconditionError(
          absl::StrCat("checkpoint ", newest->id(), " holds table '",
                       options_.table, "' of L-BFGS history ", state.history(),
                       " and ", spec == nullptr ? 0 : spec->num_keys(),
                       " keys x ", spec == nullptr ? 0 : spec->width(),
                       "; this run has history ", options_.lbfgs.history,
                       " and ", problem_->num_keys(), " x ", problem_->width(),
                       " (--resume=false, or another --table, starts "
                       "afresh)"));
    }
    absl::StatusOr<proto::RestoreCheckpointReply> restored;
    SchedulerClient slow = Scheduler(absl::Minutes(11));
    // A restore the scheduler started itself (a whole job restarted) may
    // be under way; this one follows it.
    while (!(restored = slow.RestoreCheckpoint(newest->id(), absl::Minutes(10)))
                .ok() &&
           ReasonOf(restored.status()) == ErrorReason::kRestoreUnderWay &&
           absl::Now() < deadline + absl::Minutes(1)) {
      absl::SleepFor(absl::Milliseconds(500));
    }
    if (!restored.ok()) return restored.status();
    DP_LOG(WARNING) << "resuming after iteration " << state.iteration()
                    << " (f " << state.f() << ") from checkpoint "
                    << newest->id() << ", epoch " << restored->epoch();
    return state;
  }

  // Has the scheduler take a checkpoint holding `state`; the driver waits,
  // so the vectors are those `state` describes.
  void SaveState(const proto::LbfgsState& state) {
    const absl::Duration timeout = absl::Minutes(2);
    absl::StatusOr<proto::CheckpointManifest> m =
        Scheduler(timeout + absl::Seconds(10)).Checkpoint(timeout, state);
    if (!m.ok()) {
      DP_LOG(WARNING) << "no checkpoint after iteration " << state.iteration()
                      << " (the run goes on): " << m.status();
      return;
    }
    DP_LOG(INFO) << "checkpoint " << m->id() << " holds iteration "
                 << state.iteration() << " (" << m->bytes() << " bytes, "
                 << m->duration_ms() << " ms)";
  }

  const CoordinatorOptions options_;
  std::optional<proto::LbfgsState> resume_;
  TaskPool pool_;
  std::unique_ptr<TaskProblem> problem_;
  std::unique_ptr<Client> client_;
  Table table_;
  proto::SandblasterProblem spec_;
  std::unique_ptr<HealthService> health_;  // outlives server_
  std::unique_ptr<grpc::Server> server_;
  int port_ = 0;
  std::string address_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<Coordinator>> Coordinator::Start(
    const CoordinatorOptions& options) {
  if (options.tasks < 1) {
    return absl::InvalidArgumentError("tasks must be >= 1");
  }
  if (options.checkpoint_every_iterations < 0) {
    return absl::InvalidArgumentError(
        "checkpoint_every_iterations must be >= 0");
  }
  auto c = std::make_unique<CoordinatorImpl>(options);
  DP_RETURN_IF_ERROR(c->Init());
  return std::unique_ptr<Coordinator>(std::move(c));
}

absl::StatusOr<LbfgsResult> RunLocalLbfgs(
    const TaskProblem& problem, const LbfgsOptions& options, int tasks,
    const std::function<void(const IterationRecord&)>& on_iteration,
    std::vector<float>* x_out) {
  LocalVectorSpace space(LbfgsVectors::Names(options.history).size(),
                         problem.num_keys(), problem.width());
  LocalObjective objective(&problem, &space, tasks);
  LbfgsOptions lo = options;
  lo.regularized_keys = problem.RegularizedKeys();
  auto result = MinimizeLbfgs(&space, &objective, lo, on_iteration);
  if (x_out != nullptr) *x_out = space.vector(LbfgsVectors::kX);
  return result;
}

}  // namespace downpour
