// lbfgs_bench: Sandblaster L-BFGS speed on a local cluster.
//
//   bazel build -c opt //bench:lbfgs_bench && bazel-bin/bench/lbfgs_bench
//
// Prints seconds per iteration of softmax regression on Fashion-MNIST with
// 1, 2 and 4 workers; the same with one worker slowed 5x, without and with
// backup copies of late tasks (ratios against the run without a slow worker
// of the same size, measured in the same invocation); and the bytes that
// move between coordinator and servers per iteration for two model sizes,
// which must not grow with the model. Every run is bounded
// (--iterations) and prints a line as it finishes. --cluster_secret_file and
// the --tls_* flags (common/auth.h) go to every process of every run.
#include <cstdio>
#include <string>
#include <vector>

#include "absl/flags/declare.h"
#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/auth.h"
#include "common/usage.h"
#include "launch/local_cluster.h"
#include "testing/sandblaster_job.h"

// Defined in common/auth.cc, with the --tls_* flags.
ABSL_DECLARE_FLAG(std::string, cluster_secret_file);

ABSL_FLAG(std::string, bin_dir, "", "folder with the daemons (default: ours)");
ABSL_FLAG(std::string, work_dir, "/tmp/lbfgs_bench", "logs");
ABSL_FLAG(int, iterations, 15, "L-BFGS iterations per run");
ABSL_FLAG(std::string, workers, "1,2,4", "worker counts");
ABSL_FLAG(int, tasks, 32, "tasks per evaluation");

namespace downpour {
namespace {

struct Row {
  double seconds_per_iteration = 0;
  double bytes_per_iteration = 0;
  double f = 0;
};

Row RunOne(const std::string& label, std::vector<std::string> coordinator,
           int workers, double slow, bool backups) {
  SandblasterJobOptions o;
  o.bin_dir = absl::GetFlag(FLAGS_bin_dir).empty()
                  ? BinDirOfThisProgram()
                  : absl::GetFlag(FLAGS_bin_dir);
  o.work_dir = absl::GetFlag(FLAGS_work_dir) + "/" + label;
  o.cluster_secret_file = absl::GetFlag(FLAGS_cluster_secret_file);
  o.tls = ClusterAuth::TlsFilesFromFlags();
  o.coordinator_flags = std::move(coordinator);
  o.coordinator_flags.push_back(
      absl::StrCat("--max_iterations=", absl::GetFlag(FLAGS_iterations)));
  o.coordinator_flags.push_back(
      absl::StrCat("--tasks=", absl::GetFlag(FLAGS_tasks)));
  o.coordinator_flags.push_back(backups ? "--backup_tasks=true"
                                        : "--backup_tasks=false");
  for (int i = 0; i < workers; ++i) {
    o.workers.push_back({});
    if (i == 0 && slow > 1)
      o.workers[0].push_back(absl::StrCat("--slow_factor=", slow));
  }
  auto r = RunSandblasterJob(o);
  Row row;
  if (!r.ok()) {
    std::fprintf(stderr, "%s: %s\n", label.c_str(),
                 r.status().ToString().c_str());
    return row;
  }
  // From iteration 1 on: the first evaluation also waits for the workers
  // to load the data.
  const size_t n = r->seconds.size();
  row.seconds_per_iteration =
      n > 2 ? (r->seconds[n - 1] - r->seconds[1]) / (n - 2) : 0;
  row.bytes_per_iteration =
      r->Num("coordinator_bytes") / std::max<double>(1, n - 1);
  row.f = r->f.back();
  std::printf("  %-28s %8.3f s/iter  %8.0f B/iter  f %.6f  backups %s\n",
              label.c_str(), row.seconds_per_iteration, row.bytes_per_iteration,
              row.f, r->summary["tasks_backup"].c_str());
  std::fflush(stdout);
  return row;
}

int Main() {
  std::vector<int> counts;
  for (absl::string_view c :
       absl::StrSplit(absl::GetFlag(FLAGS_workers), ',')) {
    int v;
    if (absl::SimpleAtoi(c, &v) && v > 0) counts.push_back(v);
  }
  std::printf(
      "Sandblaster L-BFGS, softmax on Fashion-MNIST, %d iterations per run\n",
      absl::GetFlag(FLAGS_iterations));
  struct Line {
    int workers;
    Row base, slow_nobackup, slow_backup;
  };
  std::vector<Line> lines;
  for (int w : counts) {
    Line l;
    l.workers = w;
    l.base = RunOne(absl::StrCat("w", w), {}, w, 1, true);
    l.slow_nobackup =
        RunOne(absl::StrCat("w", w, "_slow_nobackup"), {}, w, 5, false);
    l.slow_backup =
        RunOne(absl::StrCat("w", w, "_slow_backup"), {}, w, 5, true);
    lines.push_back(l);
  }
  std::printf(
      "\n| workers | s/iter | slow x5, no backups | slow x5, backups |\n"
      "|---|---|---|---|\n");
  for (const Line& l : lines) {
    std::printf(
        "| %d | %.3f | %.3f (%.2fx) | %.3f (%.2fx) |\n", l.workers,
        l.base.seconds_per_iteration, l.slow_nobackup.seconds_per_iteration,
        l.slow_nobackup.seconds_per_iteration / l.base.seconds_per_iteration,
        l.slow_backup.seconds_per_iteration,
        l.slow_backup.seconds_per_iteration / l.base.seconds_per_iteration);
  }
  // Coordinator traffic against model size: sparse LR over 2^14 and 2^20
  // features (64 KB and 4 MB vectors).
  std::printf(
      "\nCoordinator <-> servers traffic per iteration (sparse LR, 2 "
      "workers)\n");
  for (int bits : {14, 20}) {
    RunOne(absl::StrCat("sparse_2^", bits),
           {"--problem=sparse_lr", "--data=", "--rows=50000",
            absl::StrCat("--num_features=", 1 << bits), "--table=sparse"},
           2, 1, true);
  }
  return 0;
}

}  // namespace
}  // namespace downpour

int main(int argc, char** argv) {
  downpour::SetUsage(
      "times Sandblaster L-BFGS on local clusters (usage: lbfgs_bench "
      "[flags])");
  absl::ParseCommandLine(argc, argv);
  return downpour::Main();
}
