// ps_lbfgs: the Sandblaster L-BFGS coordinator. See lbfgs/coordinator.h.
//
//   ps_lbfgs --scheduler=127.0.0.1:7070 --problem=softmax --address_file=/tmp/c
//   ps_worker --job=lbfgs --scheduler=127.0.0.1:7070 --coordinator=$(cat
//   /tmp/c)
//
// --reference runs the same algorithm in this process instead (no cluster).
#include <fstream>

#include "absl/flags/flag.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/mutex.h"
#include "client/traffic_metrics.h"
#include "common/address_file.h"
#include "common/auth.h"
#include "common/logging.h"
#include "common/program.h"
#include "common/signals.h"
#include "lbfgs/coordinator.h"
#include "metrics/metrics_flags.h"

ABSL_FLAG(std::string, scheduler, "127.0.0.1:7070",
          "host:port of ps_scheduler");
ABSL_FLAG(std::string, listen, "127.0.0.1:0", "address of the task service");
ABSL_FLAG(std::string, address_file, "",
          "write the task service's host:port here once serving");
ABSL_FLAG(std::string, problem, "softmax",
          "softmax (Fashion-MNIST) or sparse_lr");
ABSL_FLAG(std::string, data, "/usr/share/datasets/fashion-mnist",
          "softmax: Fashion-MNIST folder; sparse_lr: libsvm file (empty: "
          "generated click data)");
ABSL_FLAG(uint64_t, num_features, 0, "sparse_lr: feature ids are below this");
ABSL_FLAG(uint64_t, rows, 100000, "sparse_lr: generated rows");
ABSL_FLAG(uint64_t, seed, 1, "sparse_lr: generator seed");
ABSL_FLAG(std::string, table, "lbfgs", "parameter table name");
ABSL_FLAG(int32_t, history, 10, "L-BFGS history m");
ABSL_FLAG(int32_t, max_iterations, 100, "iteration limit");
ABSL_FLAG(double, lambda, 1e-4, "L2 weight (biases are not regularized)");
ABSL_FLAG(double, gtol, 1e-6, "stop when |g| <= gtol * max(1, |x|)");
ABSL_FLAG(double, ftol, 1e-10,
          "stop when the relative objective change is below");
ABSL_FLAG(int32_t, tasks, 32, "tasks per objective evaluation");
ABSL_FLAG(bool, backup_tasks, true,
          "give idle workers copies of running tasks");
ABSL_FLAG(int64_t, task_lease_ms, 30000,
          "hand a task out again when every copy ran this long");
ABSL_FLAG(int32_t, checkpoint_every_iterations, 0,
          "have the scheduler take a checkpoint holding the L-BFGS state "
          "after every this many iterations (0: never; needs the scheduler's "
          "--state_dir and the servers' --data_dir)");
ABSL_FLAG(bool, resume, true,
          "at start, go on from the newest checkpoint holding this table's "
          "L-BFGS state (rolling the job back to it), if there is one");
ABSL_FLAG(bool, reference, false, "run single-process, without a cluster");
ABSL_FLAG(std::string, trace_csv, "",
          "write iteration,f,gnorm,step,evaluations,seconds");
ABSL_FLAG(std::string, summary_file, "", "write key=value results here");

namespace downpour {
namespace {

// The coordinator's figures: the last iteration, the tasks handed out
// (backup copies among them) and its data-plane traffic.
void WriteLbfgsMetrics(const IterationRecord& last, const TaskStats& tasks,
                       const TrafficStats& traffic, MetricWriter* w) {
  w->Gauge("downpour_lbfgs_iteration", "L-BFGS iterations completed", {},
           last.iteration);
  w->Gauge("downpour_lbfgs_objective", "Objective at the current point", {},
           last.f);
  w->Gauge("downpour_lbfgs_gradient_norm", "Gradient norm at the current point",
           {}, last.gnorm);
  w->Counter("downpour_lbfgs_evaluations_total",
             "Objective evaluations (task rounds)", {}, last.evaluations);
  w->Counter("downpour_lbfgs_tasks_total", "Task copies handed out, by kind",
             {{"kind", "first"}}, static_cast<double>(tasks.assigned));
  w->Counter("downpour_lbfgs_tasks_total", "Task copies handed out, by kind",
             {{"kind", "backup"}}, static_cast<double>(tasks.backups));
  w->Counter("downpour_lbfgs_tasks_total", "Task copies handed out, by kind",
             {{"kind", "reassigned"}}, static_cast<double>(tasks.reassigned));
  w->Counter("downpour_lbfgs_results_dropped_total",
             "Task results not counted (a duplicate or late copy)", {},
             static_cast<double>(tasks.dropped));
  WriteClientTrafficMetrics(traffic, w);
}

int Main() {
  MetricsRegistry metrics;
  auto endpoint = StartMetricsFromFlags(&metrics);
  if (!endpoint.ok()) {
    DP_LOG(ERROR) << endpoint.status();
    return 2;
  }
  absl::Mutex last_mu;
  IterationRecord last_record;
  proto::SandblasterProblem problem;
  problem.set_kind(absl::GetFlag(FLAGS_problem));
  problem.set_data_path(absl::GetFlag(FLAGS_data));
  problem.set_num_features(absl::GetFlag(FLAGS_num_features));
  problem.set_generate_rows(absl::GetFlag(FLAGS_rows));
  problem.set_seed(absl::GetFlag(FLAGS_seed));
  LbfgsOptions lo;
  lo.history = absl::GetFlag(FLAGS_history);
  lo.max_iterations = absl::GetFlag(FLAGS_max_iterations);
  lo.lambda = absl::GetFlag(FLAGS_lambda);
  lo.gtol = absl::GetFlag(FLAGS_gtol);
  lo.ftol = absl::GetFlag(FLAGS_ftol);
  const int tasks = absl::GetFlag(FLAGS_tasks);

  std::ofstream trace;
  if (!absl::GetFlag(FLAGS_trace_csv).empty()) {
    trace.open(absl::GetFlag(FLAGS_trace_csv));
    trace << "iteration,f,gnorm,step,evaluations,seconds\n";
  }
  auto on_iteration = [&](const IterationRecord& r) {
    {
      absl::MutexLock lock(&last_mu);
      last_record = r;
    }
    std::printf("iter %4d  f %.10f  |g| %.3e  step %.3g  evals %4d  %.1f s\n",
                r.iteration, r.f, r.gnorm, r.step, r.evaluations, r.seconds);
    std::fflush(stdout);
    if (trace.is_open()) {
      trace << absl::StrFormat("%d,%.17g,%.17g,%.17g,%d,%.6f\n", r.iteration,
                               r.f, r.gnorm, r.step, r.evaluations, r.seconds);
      trace.flush();
    }
  };

  absl::StatusOr<LbfgsResult> result;
  absl::StatusOr<std::pair<double, double>> held_out;
  std::unique_ptr<Coordinator> coordinator;
  MetricsRegistry::Registration coordinator_metrics;  // goes first
  TrafficStats iteration_traffic;
  if (absl::GetFlag(FLAGS_reference)) {
    auto p = TaskProblem::Load(problem);
    if (!p.ok()) {
      DP_LOG(ERROR) << p.status();
      return 1;
    }
    std::vector<float> x;
    result = RunLocalLbfgs(**p, lo, tasks, on_iteration, &x);
    if (result.ok()) held_out = (*p)->Evaluate(x);
  } else {
    auto auth = ClusterAuth::FromFlags(kGrpcClientAndServer);
    if (!auth.ok()) {
      DP_LOG(ERROR) << auth.status();
      return 2;
    }
    CoordinatorOptions o;
    o.scheduler_address = absl::GetFlag(FLAGS_scheduler);
    o.auth = *auth;
    o.listen_address = absl::GetFlag(FLAGS_listen);
    o.problem = problem;
    o.table = absl::GetFlag(FLAGS_table);
    o.lbfgs = lo;
    o.tasks = tasks;
    o.backup_tasks = absl::GetFlag(FLAGS_backup_tasks);
    o.task_lease = absl::Milliseconds(absl::GetFlag(FLAGS_task_lease_ms));
    o.checkpoint_every_iterations =
        absl::GetFlag(FLAGS_checkpoint_every_iterations);
    o.resume = absl::GetFlag(FLAGS_resume);
    auto c = Coordinator::Start(o);
    if (!c.ok()) {
      DP_LOG(ERROR) << "cannot start: " << c.status();
      return 1;
    }
    coordinator = *std::move(c);
    if (*endpoint != nullptr) {
      coordinator_metrics = metrics.Add([&](MetricWriter* w) {
        IterationRecord last;
        {
          absl::MutexLock lock(&last_mu);
          last = last_record;
        }
        WriteLbfgsMetrics(last, coordinator->task_stats(),
                          coordinator->traffic(), w);
      });
    }
    const std::string file = absl::GetFlag(FLAGS_address_file);
    if (!file.empty()) {
      if (absl::Status s = WriteAddressFile(file, coordinator->address());
          !s.ok()) {
        DP_LOG(ERROR) << s;
        return 1;
      }
    }
    // Destroyed (disarmed) before `coordinator`.
    TerminationHandler on_signal =
        OnTerminationSignal([c = coordinator.get()] { c->Shutdown(); });
    result = coordinator->Run(on_iteration);
    iteration_traffic = coordinator->traffic();  // before the final pull
    if (result.ok()) held_out = coordinator->EvaluateHeldOut();
  }
  if (!result.ok()) {
    DP_LOG(ERROR) << "L-BFGS failed: " << result.status();
    return 1;
  }
  const IterationRecord& last = result->iterations.back();
  const int iters = std::max(last.iteration, 1);
  std::string summary = absl::StrFormat(
      "iterations=%d\nf=%.17g\ngnorm=%.17g\nevaluations=%d\nseconds=%.6f\n"
      "seconds_per_iteration=%.6f\nstop=%s\n",
      last.iteration, last.f, last.gnorm, last.evaluations, last.seconds,
      last.seconds / iters, result->stop_reason);
  if (held_out.ok()) {
    absl::StrAppendFormat(&summary, "test_accuracy=%.6f\ntest_loss=%.6f\n",
                          held_out->first, held_out->second);
  }
  if (coordinator != nullptr) {
    const TaskStats ts = coordinator->task_stats();
    // Iterations only: the final held-out evaluation pulls x once.
    const TrafficStats& tr = iteration_traffic;
    absl::StrAppendFormat(
        &summary,
        "tasks_assigned=%d\ntasks_backup=%d\ntasks_reassigned=%d\n"
        "results_dropped=%d\ncoordinator_requests=%d\ncoordinator_bytes=%d\n",
        ts.assigned, ts.backups, ts.reassigned, ts.dropped, tr.requests,
        tr.bytes_sent + tr.bytes_received);
  }
  std::printf("\nL-BFGS stopped (%s) after %d iterations\n%s",
              result->stop_reason.c_str(), last.iteration, summary.c_str());
  if (!absl::GetFlag(FLAGS_summary_file).empty()) {
    std::ofstream out(absl::GetFlag(FLAGS_summary_file));
    out << summary;
  }
  if (coordinator != nullptr) coordinator->Shutdown();
  return 0;
}

}  // namespace
}  // namespace downpour

int main(int argc, char** argv) {
  downpour::ProgramStart start;
  start.usage =
      "the Sandblaster L-BFGS coordinator (usage: ps_lbfgs "
      "--scheduler=HOST:PORT --problem=softmax|sparse_lr [flags])";
  start.tune_allocator = true;
  start.block_termination_signals = true;
  if (!downpour::StartProgram(argc, argv, start).ok()) return 2;
  return downpour::Main();
}
