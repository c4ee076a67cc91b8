// ps_worker: trains a model replica against the servers. See worker.h.
#include <atomic>
#include <cstdlib>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "common/auth.h"
#include "common/logging.h"
#include "common/program.h"
#include "common/signals.h"
#include "common/token_file.h"
#include "metrics/metrics_flags.h"
#include "worker/sandblaster_worker.h"
#include "worker/worker.h"

ABSL_FLAG(std::string, job, "train",
          "train (a model replica under the job's consistency policy) or "
          "lbfgs (Sandblaster gradient tasks from --coordinator)");
ABSL_FLAG(std::string, coordinator, "", "lbfgs: host:port of ps_lbfgs");
ABSL_FLAG(int64_t, coordinator_timeout_ms, 60000,
          "lbfgs: give up when the coordinator cannot be reached for this "
          "long (a restarted one is waited for at the same address)");
ABSL_FLAG(int32_t, crash_at_task, 0,
          "lbfgs test hook: exit abruptly inside the n-th task");

ABSL_FLAG(std::string, scheduler, "127.0.0.1:7070",
          "host:port of ps_scheduler");
ABSL_FLAG(std::string, name, "", "stable worker name");
ABSL_FLAG(std::string, job_token_file, "",
          "file holding the job token, when the scheduler has one "
          "(ps_scheduler --job_token_file): without it no rank is granted");
ABSL_FLAG(int32_t, rank, -1,
          "rank to take (e.g. $JOB_COMPLETION_INDEX); -1: the scheduler picks");
ABSL_FLAG(std::string, health_listen, "",
          "if set, serve gRPC health here (host:port): liveness as service "
          "\"liveness\", readiness (registered) as the overall service");
ABSL_FLAG(std::string, model, "mlp", "softmax, mlp or sparse_lr");
ABSL_FLAG(std::string, data_dir, "/usr/share/datasets/fashion-mnist",
          "Fashion-MNIST IDX files");
ABSL_FLAG(int32_t, batch, 64, "mini-batch per worker");
ABSL_FLAG(int64_t, steps, 1000, "iterations");
ABSL_FLAG(double, lr, 0.05, "BSP: per-worker learning rate (scaled by N)");
ABSL_FLAG(int32_t, warmup_steps, 100, "BSP: warm-up steps to N x lr");
ABSL_FLAG(double, lr_decay_from, 1.0,
          "BSP: from this fraction of --steps on, the rate falls linearly to "
          "0 at the last step; 1: constant");
ABSL_FLAG(double, momentum, 0,
          "BSP: servers apply each step with heavy-ball momentum (0: plain "
          "SGD)");
ABSL_FLAG(double, async_lr, 0.05, "SSP/ASP: servers' Adagrad learning rate");
ABSL_FLAG(int32_t, n_fetch, 1, "ASP: pull every n steps");
ABSL_FLAG(int32_t, n_push, 1, "ASP: push accumulated gradients every n steps");
ABSL_FLAG(int32_t, eval_every, 100, "rank 0: evaluate every n steps");
ABSL_FLAG(double, slow_factor, 1.0, "slow this worker down by this factor");
ABSL_FLAG(int32_t, threads, 1, "threads for gradients");
ABSL_FLAG(std::string, device, "cpu", "cpu, or cuda (mlp only)");
ABSL_FLAG(int32_t, hogwild_threads, 1,
          "ASP, softmax/mlp: K > 1 lock-free threads sharing one parameter "
          "array (Hogwild)");
ABSL_FLAG(uint64_t, seed, 1,
          "seed for initialization, batches and synthetic click data");
ABSL_FLAG(std::string, libsvm, "",
          "sparse_lr: libsvm text file (empty: synthetic click data)");
ABSL_FLAG(int64_t, click_rows, 100000, "sparse_lr synthetic data: rows");
ABSL_FLAG(int32_t, click_features_per_row, 20,
          "sparse_lr synthetic data: features per row");
ABSL_FLAG(uint64_t, click_num_features, 100000,
          "sparse_lr synthetic data: distinct feature ids");
ABSL_FLAG(double, click_zipf, 1.1,
          "sparse_lr synthetic data: power-law exponent of feature ids");
ABSL_FLAG(double, holdout, 0.1, "sparse_lr: fraction of rows held out");
ABSL_FLAG(double, l2, 0, "sparse_lr: L2 on the weights of each batch");

int main(int argc, char** argv) {
  downpour::ProgramStart start;
  start.usage =
      "a Downpour worker: one model replica, or Sandblaster tasks with "
      "--job=lbfgs (usage: ps_worker --scheduler=HOST:PORT --name=NAME "
      "[flags])";
  start.tune_allocator = true;
  // Before any thread starts (the metrics endpoint's below): a thread with
  // SIGTERM unblocked would take it and the process would die of it
  // instead of finishing its step (the training job) or exiting 143.
  start.block_termination_signals = true;
  if (!downpour::StartProgram(argc, argv, start).ok()) return 2;
  auto auth = downpour::ClusterAuth::FromFlags(downpour::kGrpcClient);
  if (!auth.ok()) {
    DP_LOG(ERROR) << auth.status();
    return 2;
  }
  downpour::MetricsRegistry metrics;
  auto endpoint = downpour::StartMetricsFromFlags(&metrics);
  if (!endpoint.ok()) {
    DP_LOG(ERROR) << endpoint.status();
    return 2;
  }
  if (absl::GetFlag(FLAGS_job) == "lbfgs") {
    // A Sandblaster worker holds no state: SIGTERM ends it at once.
    downpour::TerminationHandler on_signal =
        downpour::OnTerminationSignal([] { std::_Exit(143); });
    downpour::SandblasterWorkerOptions so;
    so.scheduler_address = absl::GetFlag(FLAGS_scheduler);
    so.auth = *auth;
    so.coordinator_address = absl::GetFlag(FLAGS_coordinator);
    so.name = absl::GetFlag(FLAGS_name);
    so.health_listen = absl::GetFlag(FLAGS_health_listen);
    so.slow_factor = absl::GetFlag(FLAGS_slow_factor);
    so.crash_at_task = absl::GetFlag(FLAGS_crash_at_task);
    so.coordinator_timeout =
        absl::Milliseconds(absl::GetFlag(FLAGS_coordinator_timeout_ms));
    downpour::SetLogTag(absl::StrCat("lbfgs worker ", so.name));
    absl::Status s = downpour::RunSandblasterWorker(so);
    if (!s.ok()) {
      DP_LOG(ERROR) << s;
      return 1;
    }
    return 0;
  }
  if (absl::GetFlag(FLAGS_job) != "train") {
    DP_LOG(ERROR) << "unknown --job " << absl::GetFlag(FLAGS_job)
                  << " (train, lbfgs)";
    return 2;
  }
  // SIGTERM (Kubernetes stopping the pod): finish the step under way, so
  // that a BSP step completes and the job's last checkpoint can cut it,
  // report the clock reached, leave the job (the rank waits for a
  // replacement, nobody waits for this worker's heartbeats to stop) and
  // exit with 143. A step that cannot finish (its peers are gone) is given
  // 15 s, then abandoned: the worker leaves from here. (The signals were
  // blocked at the start, so that only the waiter sees them.)
  std::atomic<downpour::Worker*> running{nullptr};
  absl::Notification run_ended;
  downpour::TerminationHandler on_signal =
      downpour::OnTerminationSignal([&running, &run_ended] {
        downpour::Worker* w = running.load();
        if (w == nullptr) {
          DP_LOG(INFO) << "SIGTERM before training started: exiting";
          std::_Exit(143);
        }
        DP_LOG(INFO) << "SIGTERM: stopping after the current step";
        w->RequestStop();
        if (run_ended.WaitForNotificationWithTimeout(absl::Seconds(15))) {
          return;  // main() reports the stop and exits with 143
        }
        absl::Status left = w->Leave(
            "SIGTERM (the current step did not end in 15 s)", absl::Seconds(5));
        if (!left.ok()) DP_LOG(ERROR) << "leaving the job: " << left;
        std::_Exit(143);  // 128 + SIGTERM, as if killed by it
      });
  downpour::WorkerOptions o;
  o.scheduler_address = absl::GetFlag(FLAGS_scheduler);
  o.auth = *auth;
  o.name = absl::GetFlag(FLAGS_name);
  o.rank = absl::GetFlag(FLAGS_rank);
  if (const std::string path = absl::GetFlag(FLAGS_job_token_file);
      !path.empty()) {
    auto token = downpour::ReadTokenFile(path);
    if (!token.ok()) {
      DP_LOG(ERROR) << "--job_token_file: " << token.status();
      return 2;
    }
    o.job_token = *token;
  }
  o.health_listen = absl::GetFlag(FLAGS_health_listen);
  o.model = absl::GetFlag(FLAGS_model);
  o.data_dir = absl::GetFlag(FLAGS_data_dir);
  o.batch = absl::GetFlag(FLAGS_batch);
  o.steps = absl::GetFlag(FLAGS_steps);
  o.lr = absl::GetFlag(FLAGS_lr);
  o.warmup_steps = absl::GetFlag(FLAGS_warmup_steps);
  o.lr_decay_from = absl::GetFlag(FLAGS_lr_decay_from);
  o.momentum = absl::GetFlag(FLAGS_momentum);
  if (*endpoint != nullptr) o.metrics = &metrics;
  o.async_lr = absl::GetFlag(FLAGS_async_lr);
  o.n_fetch = std::max(1, absl::GetFlag(FLAGS_n_fetch));
  o.n_push = std::max(1, absl::GetFlag(FLAGS_n_push));
  o.eval_every = std::max(1, absl::GetFlag(FLAGS_eval_every));
  o.slow_factor = absl::GetFlag(FLAGS_slow_factor);
  o.threads = absl::GetFlag(FLAGS_threads);
  o.device = absl::GetFlag(FLAGS_device);
  o.hogwild_threads = absl::GetFlag(FLAGS_hogwild_threads);
  o.seed = absl::GetFlag(FLAGS_seed);
  o.libsvm = absl::GetFlag(FLAGS_libsvm);
  o.click_rows = absl::GetFlag(FLAGS_click_rows);
  o.click_features_per_row = absl::GetFlag(FLAGS_click_features_per_row);
  o.click_num_features = absl::GetFlag(FLAGS_click_num_features);
  o.click_zipf = absl::GetFlag(FLAGS_click_zipf);
  o.holdout = absl::GetFlag(FLAGS_holdout);
  o.l2 = static_cast<float>(absl::GetFlag(FLAGS_l2));
  // The job failed while this worker may be blocked on the data plane
  // (a lost worker was not replaced in time): say why and stop.
  o.on_job_failed = [](const absl::Status& why) {
    DP_LOG(ERROR) << "exiting: " << why;
    std::_Exit(1);
  };
  auto worker = downpour::Worker::Create(o);
  if (!worker.ok()) {
    DP_LOG(ERROR) << "cannot start: " << worker.status();
    return 1;
  }
  running.store(worker->get());
  absl::Status s = (*worker)->Run();
  run_ended.Notify();
  on_signal.Disarm();  // before the worker goes
  if (s.code() == absl::StatusCode::kCancelled) {
    DP_LOG(INFO) << "stopped on SIGTERM: " << s.message();
    return 143;
  }
  if (!s.ok()) {
    DP_LOG(ERROR) << s;
    return 1;
  }
  return 0;
}
