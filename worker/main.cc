// ps_worker: trains a model replica against the servers. See worker.h.
#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "common/malloc_tuning.h"
#include "worker/sandblaster_worker.h"
#include "worker/worker.h"

ABSL_FLAG(std::string, job, "train",
          "train (a model replica under the job's consistency policy) or "
          "lbfgs (Sandblaster gradient tasks from --coordinator)");
ABSL_FLAG(std::string, coordinator, "", "lbfgs: host:port of ps_lbfgs");
ABSL_FLAG(int32_t, crash_at_task, 0,
          "lbfgs test hook: exit abruptly inside the n-th task");

ABSL_FLAG(std::string, scheduler, "127.0.0.1:7070", "host:port of ps_scheduler");
ABSL_FLAG(std::string, name, "", "stable worker name");
ABSL_FLAG(std::string, model, "mlp", "softmax or mlp");
ABSL_FLAG(std::string, data_dir, "/usr/share/datasets/fashion-mnist",
          "Fashion-MNIST IDX files");
ABSL_FLAG(int32_t, batch, 64, "mini-batch per worker");
ABSL_FLAG(int64_t, steps, 1000, "iterations");
ABSL_FLAG(double, lr, 0.05, "BSP: per-worker learning rate (scaled by N)");
ABSL_FLAG(int32_t, warmup_steps, 100, "BSP: warm-up steps to N x lr");
ABSL_FLAG(double, async_lr, 0.05, "SSP/ASP: servers' Adagrad learning rate");
ABSL_FLAG(int32_t, n_fetch, 1, "ASP: pull every n steps");
ABSL_FLAG(int32_t, n_push, 1, "ASP: push accumulated gradients every n steps");
ABSL_FLAG(int32_t, eval_every, 100, "rank 0: evaluate every n steps");
ABSL_FLAG(double, slow_factor, 1.0, "slow this worker down by this factor");
ABSL_FLAG(int32_t, threads, 1, "threads for gradients");
ABSL_FLAG(std::string, device, "cpu", "cpu, or cuda (mlp only)");
ABSL_FLAG(uint64_t, seed, 1, "seed for initialization and batches");

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage("Downpour worker daemon");
  absl::ParseCommandLine(argc, argv);
  downpour::TuneAllocatorForLargeMessages();
  if (absl::GetFlag(FLAGS_job) == "lbfgs") {
    downpour::SandblasterWorkerOptions so;
    so.scheduler_address = absl::GetFlag(FLAGS_scheduler);
    so.coordinator_address = absl::GetFlag(FLAGS_coordinator);
    so.name = absl::GetFlag(FLAGS_name);
    so.slow_factor = absl::GetFlag(FLAGS_slow_factor);
    so.crash_at_task = absl::GetFlag(FLAGS_crash_at_task);
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
  downpour::WorkerOptions o;
  o.scheduler_address = absl::GetFlag(FLAGS_scheduler);
  o.name = absl::GetFlag(FLAGS_name);
  o.model = absl::GetFlag(FLAGS_model);
  o.data_dir = absl::GetFlag(FLAGS_data_dir);
  o.batch = absl::GetFlag(FLAGS_batch);
  o.steps = absl::GetFlag(FLAGS_steps);
  o.lr = absl::GetFlag(FLAGS_lr);
  o.warmup_steps = absl::GetFlag(FLAGS_warmup_steps);
  o.async_lr = absl::GetFlag(FLAGS_async_lr);
  o.n_fetch = std::max(1, absl::GetFlag(FLAGS_n_fetch));
  o.n_push = std::max(1, absl::GetFlag(FLAGS_n_push));
  o.eval_every = std::max(1, absl::GetFlag(FLAGS_eval_every));
  o.slow_factor = absl::GetFlag(FLAGS_slow_factor);
  o.threads = absl::GetFlag(FLAGS_threads);
  o.device = absl::GetFlag(FLAGS_device);
  o.seed = absl::GetFlag(FLAGS_seed);
  auto worker = downpour::Worker::Create(o);
  if (!worker.ok()) {
    DP_LOG(ERROR) << "cannot start: " << worker.status();
    return 1;
  }
  absl::Status s = (*worker)->Run();
  if (!s.ok()) {
    DP_LOG(ERROR) << s;
    return 1;
  }
  return 0;
}
