// ps_demo: the main job. Starts a scheduler, servers and workers on
// loopback, trains a model on Fashion-MNIST, shows progress, and writes the
// metrics as CSV and a plot of loss and accuracy against time.
//
//   bazel-bin/tools/ps_demo                       # BSP, 4 workers, MLP
//   bazel-bin/tools/ps_demo --compare             # BSP, SSP(3), ASP on one
//   plot bazel-bin/tools/ps_demo --mode=ssp --staleness=1 --slow_worker=0
//   --slow_factor=3
//
// --cluster_secret_file and the --tls_* flags (common/auth.h) go to every
// daemon it starts and to its own scheduler calls.
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "absl/flags/declare.h"
#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "cluster/scheduler_client.h"
#include "common/auth.h"
#include "common/subprocess.h"
#include "common/usage.h"
#include "launch/local_cluster.h"
#include "launch/local_job.h"
#include "models/batcher.h"
#include "models/dataset.h"
#include "models/model.h"

// Defined in common/auth.cc, with the --tls_* flags.
ABSL_DECLARE_FLAG(std::string, cluster_secret_file);

ABSL_FLAG(std::string, mode, "bsp", "bsp, ssp or asp");
ABSL_FLAG(bool, compare, false, "run BSP, SSP and ASP and plot them together");
ABSL_FLAG(int32_t, workers, 4, "workers whose updates count (N)");
ABSL_FLAG(int32_t, backup, 0, "backup workers (b)");
ABSL_FLAG(int32_t, servers, 2, "servers");
ABSL_FLAG(int64_t, staleness, 3, "SSP bound");
ABSL_FLAG(std::string, model, "mlp", "softmax or mlp");
ABSL_FLAG(std::string, device, "cpu",
          "workers' device: cpu, or cuda (mlp only)");
ABSL_FLAG(int64_t, steps, 1000, "iterations per worker");
ABSL_FLAG(int32_t, batch, 64, "mini-batch per worker");
ABSL_FLAG(double, lr, 0.03, "BSP per-worker learning rate (scaled by N)");
ABSL_FLAG(int32_t, warmup_steps, 100, "BSP: warm-up steps to N x lr");
ABSL_FLAG(double, momentum, 0.9,
          "BSP: servers' heavy-ball momentum (0: plain SGD)");
ABSL_FLAG(double, lr_decay_from, 0.3,
          "BSP: the rate falls linearly to 0 from this fraction of the steps "
          "(1: constant)");
ABSL_FLAG(double, async_lr, 0.05, "SSP/ASP Adagrad learning rate");
ABSL_FLAG(int32_t, slow_worker, -1, "rank to slow down (-1: none)");
ABSL_FLAG(double, slow_factor, 3.0, "how much slower");
ABSL_FLAG(std::vector<std::string>, targets,
          std::vector<std::string>({"0.85", "0.87"}),
          "test accuracies whose time to reach is reported");
ABSL_FLAG(int32_t, eval_every, 50, "evaluate every n steps");
ABSL_FLAG(std::string, out_dir, "out/demo", "CSV, plot and logs go here");
ABSL_FLAG(std::string, bin_dir, "",
          "folder holding the daemons (default: ours)");
ABSL_FLAG(int64_t, timeout_s, 1200, "give up after this long per run");
ABSL_FLAG(std::string, data_listen, "",
          "servers' data-plane endpoint (ps_server --data_listen), e.g. "
          "ipc://* for ZeroMQ over Unix sockets; empty: the server's default "
          "(TCP on 127.0.0.1)");
ABSL_FLAG(int32_t, poll_ms, 200,
          "how often the job's status is sampled (--overhead: 10 ms); the "
          "training rates are good to about this over the run's length");
ABSL_FLAG(bool, overhead, false,
          "time one epoch in-process and with 1 server + 1 worker under "
          "--mode (default bsp), and print the ratio");

namespace downpour {
namespace {

struct RunResult {
  std::string label;
  double seconds = 0;
  // The time per step between the first completed step and the last one
  // before the final step, times the steps: the training time without
  // process start-up, data loading and the final evaluation.
  double train_seconds = 0;
  // Examples per second while every worker trains: from the first sample
  // where all have reported a step to the last one before any finished
  // (start-up, the last steps and the final evaluation left out). What
  // psctl plan predicts; 0 if the run was too short to see such a window.
  double examples_per_s = 0;
  // CPU seconds per worker step over the same window (all threads of the
  // processes): the workers' and the servers' (summed over servers).
  double worker_cpu_per_step = 0;
  double server_cpu_per_step = 0;
  double final_accuracy = 0;
  std::vector<double> time_to_target;  // per target; -1: not reached
  int64_t max_staleness = 0;
  uint64_t discarded = 0;
  bool ok = false;
};

// The cluster's security, from the flags (checked in main()).
struct Security {
  std::string secret_file;
  TlsFiles tls;
  ClusterAuth auth;  // for this program's own scheduler calls
};

std::vector<double> Targets() {
  std::vector<double> out;
  for (const std::string& t : absl::GetFlag(FLAGS_targets)) {
    double v;
    if (absl::SimpleAtod(t, &v)) out.push_back(v);
  }
  return out;
}

RunResult RunOnce(const std::string& mode, const Security& security,
                  std::ofstream& csv) {
  RunResult r;
  r.label = mode == "ssp"
                ? absl::StrCat("ssp(s=", absl::GetFlag(FLAGS_staleness), ")")
                : mode;
  if (absl::GetFlag(FLAGS_backup) > 0) absl::StrAppend(&r.label, "+backup");
  if (absl::GetFlag(FLAGS_slow_worker) >= 0) absl::StrAppend(&r.label, "+slow");
  const std::string bin = absl::GetFlag(FLAGS_bin_dir).empty()
                              ? BinDirOfThisProgram()
                              : absl::GetFlag(FLAGS_bin_dir);
  const int n = absl::GetFlag(FLAGS_workers), b = absl::GetFlag(FLAGS_backup);
  LocalJobOptions o;
  o.cluster.bin_dir = bin;
  o.cluster.work_dir =
      absl::StrCat(absl::GetFlag(FLAGS_out_dir), "/logs-", mode);
  std::system(("mkdir -p " + o.cluster.work_dir).c_str());
  o.cluster.num_servers = absl::GetFlag(FLAGS_servers);
  // LocalJob gives them to the workers too.
  o.cluster.cluster_secret_file = security.secret_file;
  o.cluster.tls = security.tls;
  if (!absl::GetFlag(FLAGS_data_listen).empty()) {
    o.cluster.server_flags.push_back("--data_listen=" +
                                     absl::GetFlag(FLAGS_data_listen));
  }
  o.cluster.scheduler_flags = {
      absl::StrCat("--consistency=", mode),
      absl::StrCat("--staleness=", absl::GetFlag(FLAGS_staleness)),
      absl::StrCat("--num_workers=", n), absl::StrCat("--backup_workers=", b)};
  o.worker_name_prefix = "worker-";
  for (int i = 0; i < n + b; ++i) {
    std::vector<std::string> flags = {
        "--model=" + absl::GetFlag(FLAGS_model),
        absl::StrCat("--steps=", absl::GetFlag(FLAGS_steps)),
        absl::StrCat("--batch=", absl::GetFlag(FLAGS_batch)),
        absl::StrCat("--lr=", absl::GetFlag(FLAGS_lr)),
        absl::StrCat("--warmup_steps=", absl::GetFlag(FLAGS_warmup_steps)),
        absl::StrCat("--momentum=", absl::GetFlag(FLAGS_momentum)),
        absl::StrCat("--lr_decay_from=", absl::GetFlag(FLAGS_lr_decay_from)),
        absl::StrCat("--async_lr=", absl::GetFlag(FLAGS_async_lr)),
        absl::StrCat("--eval_every=", absl::GetFlag(FLAGS_eval_every)),
        "--device=" + absl::GetFlag(FLAGS_device)};
    if (i == absl::GetFlag(FLAGS_slow_worker)) {
      flags.push_back(
          absl::StrCat("--slow_factor=", absl::GetFlag(FLAGS_slow_factor)));
    }
    o.workers.push_back(flags);
  }
  auto job = LocalJob::Start(o);
  if (!job.ok()) {
    std::fprintf(stderr, "cannot start the job: %s\n",
                 job.status().ToString().c_str());
    return r;
  }
  const std::vector<double> targets = Targets();
  r.time_to_target.assign(targets.size(), -1);
  SchedulerClient sched((*job)->scheduler_address(), absl::Seconds(10),
                        security.auth);
  const absl::Time start = absl::Now();
  const absl::Time deadline =
      start + absl::Seconds(absl::GetFlag(FLAGS_timeout_s));
  int64_t last_clock = -1;
  int64_t first_clock = -1;
  double first_time = 0;
  // The last gating clock seen below the final step, and when: the final
  // step also evaluates on the test set, which the in-process trainer of
  // --overhead does not, so the training time is scaled from the clocks
  // before it.
  int64_t last_seen_clock = -1;
  double last_seen_time = 0;
  const int64_t steps = absl::GetFlag(FLAGS_steps);
  // --overhead polls often: the clock samples bound the timing error.
  const absl::Duration poll =
      absl::GetFlag(FLAGS_overhead)
          ? absl::Milliseconds(10)
          : absl::Milliseconds(absl::GetFlag(FLAGS_poll_ms));
  // The steady-state window of examples_per_s: (time, examples) at its
  // start and at its latest sample.
  double window_t0 = -1, window_e0 = 0, window_t1 = -1, window_e1 = 0;
  // CPU of the workers and of the servers, read at each sample of the
  // window (the window's end is known only afterwards).
  auto cpu_of = [&](bool servers) {
    double total = 0;
    const int count =
        servers ? (*job)->cluster().num_servers() : (*job)->num_workers();
    for (int i = 0; i < count; ++i) {
      const pid_t pid =
          servers ? (*job)->cluster().server(i).pid() : (*job)->worker(i).pid();
      total += std::max(0.0, ProcessCpuSeconds(pid));
    }
    return total;
  };
  double cpu_w0 = 0, cpu_s0 = 0, cpu_w1 = 0, cpu_s1 = 0;
  double last_acc = 0;
  int running = n + b;
  bool failed = false;
  while (running > 0 && absl::Now() < deadline) {
    absl::SleepFor(poll);
    absl::StatusOr<int> still = (*job)->PollWorkers();
    if (!still.ok()) {
      std::fprintf(stderr, "\n%s\n", still.status().ToString().c_str());
      failed = true;
      break;
    }
    running = *still;
    auto status = sched.GetJobStatus();
    if (!status.ok()) continue;
    const double t = absl::ToDoubleSeconds(absl::Now() - start);
    const auto& w0 = status->workers(0);
    uint64_t examples = 0;
    int64_t stale = 0;
    uint64_t discarded = 0;
    for (const auto& w : status->workers()) {
      examples += w.examples();
      stale = std::max(stale, w.max_staleness());
      discarded += w.discarded();
    }
    r.max_staleness = stale;
    r.discarded = discarded;
    bool all_started = status->workers_size() == n + b, none_done = true;
    for (const auto& w : status->workers()) {
      all_started = all_started && w.clock() >= 1;
      none_done = none_done && !w.finished() && w.clock() < steps;
    }
    if (all_started && none_done) {
      if (window_t0 < 0) {
        window_t0 = t;
        window_e0 = static_cast<double>(examples);
        cpu_w0 = cpu_of(false);
        cpu_s0 = cpu_of(true);
      } else {
        window_t1 = t;
        window_e1 = static_cast<double>(examples);
        cpu_w1 = cpu_of(false);
        cpu_s1 = cpu_of(true);
      }
    }
    if (w0.test_accuracy() > 0) last_acc = w0.test_accuracy();
    for (size_t i = 0; i < targets.size(); ++i) {
      if (last_acc >= targets[i] && r.time_to_target[i] < 0)
        r.time_to_target[i] = t;
    }
    std::printf(
        "\r[%s] %5.1fs  clock %4lld/%lld  loss %.4f  test acc %.4f  %6.0f ex/s "
        " staleness<=%lld  discarded %llu   ",
        r.label.c_str(), t, static_cast<long long>(status->gating_clock()),
        static_cast<long long>(absl::GetFlag(FLAGS_steps)), w0.loss(), last_acc,
        examples / std::max(t, 1e-3), static_cast<long long>(stale),
        static_cast<unsigned long long>(discarded));
    std::fflush(stdout);
    if (first_clock < 0 && status->gating_clock() > 0) {
      first_clock = status->gating_clock();
      first_time = t;
    }
    if (status->gating_clock() > last_seen_clock &&
        status->gating_clock() < steps) {
      last_seen_clock = status->gating_clock();
      last_seen_time = t;
    }
    if (w0.clock() != last_clock && w0.clock() > 0) {
      last_clock = w0.clock();
      csv << r.label << "," << t << "," << w0.clock() << "," << w0.loss() << ","
          << last_acc << "," << examples << "," << stale << "\n";
    }
  }
  std::printf("\n");
  r.seconds = absl::ToDoubleSeconds(absl::Now() - start);
  if (first_clock >= 0 && last_seen_clock > first_clock) {
    r.train_seconds = (last_seen_time - first_time) * steps /
                      static_cast<double>(last_seen_clock - first_clock);
  }
  if (window_t1 > window_t0 && window_t0 >= 0) {
    r.examples_per_s = (window_e1 - window_e0) / (window_t1 - window_t0);
    const double worker_steps =
        (window_e1 - window_e0) / absl::GetFlag(FLAGS_batch);
    if (worker_steps > 0) {
      r.worker_cpu_per_step = (cpu_w1 - cpu_w0) / worker_steps;
      r.server_cpu_per_step = (cpu_s1 - cpu_s0) / worker_steps;
    }
  }
  r.final_accuracy = last_acc;
  r.ok = !failed && running == 0;
  (void)(*job)->Stop();  // kills workers still running
  return r;
}

void Plot(const std::string& dir, const std::vector<std::string>& labels) {
  const std::string script = dir + "/plot.gp";
  std::ofstream gp(script);
  gp << "set terminal pngcairo size 1200,500\nset output '" << dir
     << "/training.png'\n"
     << "set datafile separator ','\nset multiplot layout 1,2 title 'Downpour "
        "on Fashion-MNIST'\n"
     << "set xlabel 'seconds'\nset ylabel 'train loss (worker 0)'\nset key top "
        "right\nset grid\n";
  auto series = [&](int col) {
    std::vector<std::string> parts;
    for (const auto& l : labels) {
      parts.push_back(absl::StrCat("'< grep \"^", l, ",\" ", dir,
                                   "/metrics.csv' using 2:", col,
                                   " with lines lw 2 title '", l, "'"));
    }
    return absl::StrJoin(parts, ", ");
  };
  gp << "plot " << series(4) << "\n";
  gp << "set ylabel 'test accuracy'\nset yrange [0.6:0.92]\nset key bottom "
        "right\n";
  gp << "plot " << series(5) << "\nunset multiplot\n";
  gp.close();
  if (std::system(("gnuplot " + script + " 2>/dev/null").c_str()) == 0) {
    std::printf("plot: %s/training.png\n", dir.c_str());
  } else {
    std::printf("gnuplot failed; the data is in %s/metrics.csv\n", dir.c_str());
  }
}

// One epoch of plain mini-batch SGD in this process: the same model, batch
// and per-step arithmetic as a worker, without servers.
double InProcessEpochSeconds(int steps) {
  auto data = LoadFashionMnist("/usr/share/datasets/fashion-mnist", true);
  if (!data.ok()) return -1;
  auto model = absl::GetFlag(FLAGS_model) == "mlp"
                   ? MakeMlp({784, 256, 10})
                   : MakeSoftmaxRegression(784, 10);
  std::vector<float> params(model->NumParams()), grad(params.size());
  model->Init(1, params.data());
  Batcher batcher(data->num_examples, 1, 0);
  const absl::Time start = absl::Now();
  for (int s = 0; s < steps; ++s) {
    model->LossAndGradient(params.data(), *data,
                           batcher.Next(absl::GetFlag(FLAGS_batch)),
                           grad.data());
    for (size_t i = 0; i < params.size(); ++i) params[i] -= 0.05f * grad[i];
  }
  return absl::ToDoubleSeconds(absl::Now() - start);
}

}  // namespace
}  // namespace downpour

int main(int argc, char** argv) {
  downpour::SetUsage(
      "the Downpour demo: a local cluster trains an MLP on Fashion-MNIST "
      "(usage: ps_demo [--mode=bsp|ssp|asp] [--compare] [flags])");
  absl::ParseCommandLine(argc, argv);
  downpour::Security security;
  security.secret_file = absl::GetFlag(FLAGS_cluster_secret_file);
  security.tls = downpour::ClusterAuth::TlsFilesFromFlags();
  auto auth = downpour::ClusterAuth::FromFlags(downpour::kGrpcClient);
  if (!auth.ok()) {
    std::fprintf(stderr, "ps_demo: %s\n", auth.status().ToString().c_str());
    return 2;
  }
  security.auth = *auth;
  if (absl::GetFlag(FLAGS_overhead)) {
    // One epoch of the training set at the configured batch.
    const int steps = 60000 / absl::GetFlag(FLAGS_batch);
    const double local = downpour::InProcessEpochSeconds(steps);
    absl::SetFlag(&FLAGS_workers, 1);
    absl::SetFlag(&FLAGS_servers, 1);
    absl::SetFlag(&FLAGS_steps, steps);
    absl::SetFlag(&FLAGS_eval_every, steps);
    const std::string dir = absl::GetFlag(FLAGS_out_dir);
    std::system(("mkdir -p " + dir).c_str());
    std::ofstream csv(dir + "/overhead.csv");
    downpour::RunResult r =
        downpour::RunOnce(absl::GetFlag(FLAGS_mode), security, csv);
    std::printf("\n| setup | seconds per epoch (%d steps of %d) |\n|---|---|\n",
                steps, absl::GetFlag(FLAGS_batch));
    std::printf(
        "| in-process trainer | %.2f |\n| 1 server + 1 worker, %s | %.2f |\n",
        local, absl::GetFlag(FLAGS_mode).c_str(), r.train_seconds);
    std::printf(
        "overhead ratio: %.2f (start-up and the final evaluation excluded; "
        "%.2f s with them)\n",
        r.train_seconds / local, r.seconds);
    return r.ok ? 0 : 1;
  }
  const std::string dir = absl::GetFlag(FLAGS_out_dir);
  std::system(("mkdir -p " + dir).c_str());
  std::vector<std::string> modes = {absl::GetFlag(FLAGS_mode)};
  if (absl::GetFlag(FLAGS_compare)) modes = {"bsp", "ssp", "asp"};
  std::ofstream csv(dir + "/metrics.csv");
  csv << "run,seconds,clock,loss,test_accuracy,examples,max_staleness\n";
  std::vector<downpour::RunResult> results;
  for (const auto& m : modes) {
    results.push_back(downpour::RunOnce(m, security, csv));
    csv.flush();
  }
  std::vector<std::string> labels;
  const std::vector<double> targets = downpour::Targets();
  std::string header =
      "\n| run | seconds | training seconds | examples/s (all training) | "
      "final test accuracy |";
  std::string rule = "|---|---|---|---|---|";
  for (double t : targets) {
    absl::StrAppend(&header, " seconds to ", t * 100, "% |");
    rule += "---|";
  }
  std::printf("%s max staleness | discarded pushes |\n%s---|---|\n",
              header.c_str(), rule.c_str());
  bool ok = true;
  for (const auto& r : results) {
    labels.push_back(r.label);
    ok = ok && r.ok;
    std::string reached;
    for (double t : r.time_to_target) {
      absl::StrAppend(&reached, " ",
                      t < 0 ? "not reached" : absl::StrFormat("%.1f", t), " |");
    }
    std::printf("| %s | %.1f | %.2f | %.0f | %.4f |%s %lld | %llu |%s\n",
                r.label.c_str(), r.seconds, r.train_seconds, r.examples_per_s,
                r.final_accuracy, reached.c_str(),
                static_cast<long long>(r.max_staleness),
                static_cast<unsigned long long>(r.discarded),
                r.ok ? "" : " FAILED");
  }
  for (const auto& r : results) {
    if (r.worker_cpu_per_step <= 0) continue;
    std::printf(
        "[%s] CPU per worker step while all trained: workers %.2f ms, "
        "servers %.2f ms (%.2f cores busy)\n",
        r.label.c_str(), r.worker_cpu_per_step * 1e3,
        r.server_cpu_per_step * 1e3,
        (r.worker_cpu_per_step + r.server_cpu_per_step) * r.examples_per_s /
            absl::GetFlag(FLAGS_batch));
  }
  std::printf("metrics: %s/metrics.csv\n", dir.c_str());
  downpour::Plot(dir, labels);
  return ok ? 0 : 1;
}
