// psctl: the operator's command line for a Downpour cluster.
//
//   psctl status [--scheduler=HOST:PORT] [-o json|yaml|wide]
//   [--interval_ms=1000] psctl tables [--scheduler=HOST:PORT] [-o
//   json|yaml|wide] psctl local  [--listen=127.0.0.1:7070] [--servers=2]
//   [--replicas=1]
//                [--consistency=bsp]
//                [--num_workers=4] [--address_file=F] [--metrics]
//   psctl job    [--scheduler=HOST:PORT] [--kind=train|lbfgs]
//                [--workers=N] [--worker_flags=--model=mlp,--steps=500]
//                [--lbfgs_flags=--problem=softmax,--max_iterations=50]
//   psctl drain NAME [--cancel] [--timeout_s=120] [--scheduler=HOST:PORT]
//   psctl retire RANK [--timeout_s=120] [--scheduler=HOST:PORT]
//   psctl split TABLE KEY [--timeout_s=120] [--scheduler=HOST:PORT]
//   psctl merge TABLE KEY [--timeout_s=120] [--scheduler=HOST:PORT]
//   psctl checkpoint  [--scheduler=HOST:PORT] [--timeout_s=120]
//   psctl checkpoints [--scheduler=HOST:PORT]
//   psctl restore --checkpoint=ID [--scheduler=HOST:PORT] [--timeout_s=120]
//   psctl export --table=NAME --out=PREFIX [--scheduler=HOST:PORT]
//               [--data_dirs=D1,D2 [--checkpoint=ID]]   (offline)
//   psctl version
//   psctl calibrate [--model=F] [--calibration=F] [--scheduler=HOST:PORT]
//   psctl plan --model=F --calibration=F --workers=1..8 --servers=1..4
//              [--modes=bsp,ssp,asp] [-o json] [--plot=F.png] (planning.h)
//
// restore rolls a running job back to a checkpoint: every table as the
// checkpoint holds it, the workers' clocks the manifest's; running workers
// must register again (ps_worker exits, and its restarted pod resumes at the
// checkpoint's clock). A restarted cluster (the scheduler with its
// --state_dir, the servers with their --data_dir) resumes from the newest
// complete checkpoint by itself (docs/OPERATIONS.md, "Restore").
//
// drain moves every key range server NAME holds to the other servers while
// the job runs, then the server leaves the cluster and exits 0; psctl waits
// for it (at most --timeout_s), printing progress. --cancel calls a drain
// off (the ranges moved stay moved).
//
// split cuts the key range of TABLE holding KEY in two, [begin, KEY) and
// [KEY, end), on the same servers, while the job runs (balancing may then
// move a half); psctl waits until the map lists the halves (at most
// --timeout_s). A range of one key, a key that already begins a range and
// a cut of a bounded sparse table's range far from its middle are refused.
//
// merge joins the key range of TABLE holding KEY with the range after it,
// in place, when both are held by the same servers; psctl waits until the
// map lists one range (at most --timeout_s). Boundaries younger than the
// scheduler's --merge_min_age_s are refused.
//
// retire removes the worker of rank RANK from a running ASP or SSP job for
// good: it finishes its step, leaves (its rank retires: it gates nobody,
// no replacement is waited for) and ps_worker exits 0; psctl waits for it
// (at most --timeout_s). Then lower the worker Job's completions and
// parallelism (docs/OPERATIONS.md, "Scaling").
//
// Every command prints human tables by default, `-o wide` for more
// columns, `-o json` or `-o yaml` (the messages of psctl/psctl.proto, one
// JSON style: psctl/output.h) for scripts; `--json` is `-o json`. The
// scheduler is --scheduler, else $DOWNPOUR_SCHEDULER, else
// 127.0.0.1:7070. --cluster_secret_file is honoured by every command.
// Exit status: 0 done, 1 the operation failed, 2 bad usage.
//
// A new command: a function `int Name(const CommandContext&)` (in its own
// file if it is large) and a row of kCommands below.
#include <signal.h>
#include <sys/wait.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <string>
#include <system_error>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/reflection.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "cluster/scheduler_client.h"
#include "common/address_file.h"
#include "common/auth.h"
#include "common/logging.h"
#include "common/program.h"
#include "common/signals.h"
#include "common/subprocess.h"
#include "common/version.h"
#include "launch/local_cluster.h"
#include "psctl/cluster_status.h"
#include "psctl/export.h"
#include "psctl/output.h"
#include "psctl/planning.h"
#include "psctl/psctl.pb.h"

ABSL_FLAG(std::string, scheduler, "",
          "host:port of the ps_scheduler (default: $DOWNPOUR_SCHEDULER, "
          "else 127.0.0.1:7070)");
ABSL_FLAG(std::string, o, "",
          "output format of every command: json, yaml, wide (more "
          "columns); default: tables");
ABSL_FLAG(bool, json, false, "the same as -o json");
ABSL_FLAG(int64_t, interval_ms, 1000,
          "status: sample the servers' counters twice this far apart for "
          "rates (0: once, no rates)");
ABSL_FLAG(int64_t, rpc_timeout_ms, 5000, "deadline of every gRPC call");
ABSL_FLAG(std::string, bin_dir, "",
          "local, job: folder holding scheduler/, server/, worker/, lbfgs/ "
          "(default: the build folder psctl runs from)");
ABSL_FLAG(std::string, work_dir, "",
          "local, job: logs go here (default: /tmp/psctl-<command>-<pid>)");
ABSL_FLAG(std::string, listen, "127.0.0.1:7070",
          "local: the scheduler's host:port, --scheduler's default (port 0: "
          "a free one, printed and written to --address_file)");
ABSL_FLAG(int32_t, servers, 2, "local: servers to start");
ABSL_FLAG(int32_t, replicas, 1, "local: holders of each key range");
ABSL_FLAG(std::string, consistency, "bsp", "local: bsp, ssp or asp");
ABSL_FLAG(int64_t, staleness, 0, "local: SSP's bound");
ABSL_FLAG(int32_t, num_workers, 4, "local: workers whose updates count (N)");
ABSL_FLAG(int32_t, backup_workers, 0, "local: backup workers (b)");
ABSL_FLAG(std::string, address_file, "",
          "local: write the scheduler's host:port here once the cluster runs");
ABSL_FLAG(bool, metrics, false,
          "local: every daemon serves Prometheus metrics on a free port "
          "(logged in its log file)");
ABSL_FLAG(std::string, kind, "train",
          "job: train (ps_worker model replicas) or lbfgs (ps_lbfgs and "
          "Sandblaster workers)");
ABSL_FLAG(int32_t, workers, 0,
          "job: worker processes to start (0: the job's N + b for train, 2 "
          "for lbfgs)");
ABSL_FLAG(std::vector<std::string>, worker_flags, {},
          "job: comma-separated flags for every ps_worker, e.g. "
          "--model=mlp,--steps=500");
ABSL_FLAG(std::vector<std::string>, lbfgs_flags, {},
          "job (lbfgs): comma-separated flags for ps_lbfgs, e.g. "
          "--problem=softmax,--max_iterations=50");
ABSL_FLAG(int64_t, job_timeout_s, 3600,
          "job: give up (and stop it) after this");
ABSL_FLAG(int64_t, timeout_s, 120,
          "checkpoint, restore, drain, retire: wait this long for it to "
          "complete");
ABSL_FLAG(bool, cancel, false,
          "drain: call the server's drain off instead (ranges moved stay "
          "moved)");
ABSL_FLAG(std::string, table, "", "export: the table's name");
ABSL_FLAG(std::string, out, "",
          "export: file prefix (<out>.npy; sparse: <out>.keys.npy and "
          "<out>.values.npy)");
ABSL_FLAG(std::vector<std::string>, data_dirs, {},
          "export: read a checkpoint from these servers' data dirs instead "
          "of a running cluster");
ABSL_FLAG(uint64_t, checkpoint, 0,
          "restore: the checkpoint to roll back to; export with --data_dirs: "
          "the checkpoint (0: the newest holding the whole table)");

namespace downpour {
namespace {

constexpr int kFailed = kExitFailed;
constexpr int kUsage = kExitUsage;

// What every command gets from main(): the flags every command shares,
// read once.
struct CommandContext {
  std::string scheduler;  // host:port
  ClusterAuth auth;
  OutputFormat format = OutputFormat::kText;
  // Positional arguments after the command (psctl drain NAME).
  std::vector<std::string> args;
  // Whether the output is for a program (json, yaml): progress then goes
  // to stderr, so that stdout holds one document.
  bool machine() const {
    return format == OutputFormat::kJson || format == OutputFormat::kYaml;
  }
};

int Fail(const absl::Status& s) {
  std::fprintf(stderr, "psctl: %s\n", s.ToString().c_str());
  return kFailed;
}

absl::StatusOr<std::string> WorkDir(const std::string& command) {
  std::string dir = absl::GetFlag(FLAGS_work_dir);
  if (dir.empty()) dir = absl::StrCat("/tmp/psctl-", command, "-", getpid());
  std::error_code error;
  std::filesystem::create_directories(dir, error);
  if (error) {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot make the work dir ", dir, ": ", error.message()));
  }
  return dir;
}

std::string BinDir() {
  const std::string dir = absl::GetFlag(FLAGS_bin_dir);
  return dir.empty() ? BinDirOfThisProgram() : dir;
}

// --cluster_secret_file's value (common/auth.cc defines it).
std::string SecretFile() {
  const absl::CommandLineFlag* f =
      absl::FindCommandLineFlag("cluster_secret_file");
  return f != nullptr ? f->CurrentValue() : "";
}

// The same flag for the daemons psctl starts.
std::vector<std::string> SecretFlag() {
  if (SecretFile().empty()) return {};
  return {"--cluster_secret_file=" + SecretFile()};
}

int PrintStatus(bool tables_only, const CommandContext& ctx) {
  StatusOptions o;
  o.scheduler_address = ctx.scheduler;
  o.auth = ctx.auth;
  // Two samples for rates (tables: each range's load).
  o.interval = absl::Milliseconds(absl::GetFlag(FLAGS_interval_ms));
  o.rpc_timeout = absl::Milliseconds(absl::GetFlag(FLAGS_rpc_timeout_ms));
  absl::StatusOr<psctl::ClusterStatus> s = GatherStatus(o);
  if (!s.ok()) return Fail(s.status());
  if (tables_only) {
    psctl::ClusterStatus only;
    only.set_scheduler(s->scheduler());
    *only.mutable_tables() = s->tables();
    *only.mutable_ranges() = s->ranges();
    only.set_interval_seconds(s->interval_seconds());
    only.set_moves_under_way(s->moves_under_way());
    return PrintOutput(only, ctx.format, [&](bool wide) {
      return FormatTables(*s, wide) + "\n" + FormatRanges(*s);
    });
  }
  return PrintOutput(*s, ctx.format,
                     [&](bool wide) { return FormatStatus(*s, wide); });
}

// Starts a scheduler and servers as the demo does and keeps them until
// SIGINT or SIGTERM.
int Local(const CommandContext& ctx) {
  LocalClusterOptions o;
  o.bin_dir = BinDir();
  absl::StatusOr<std::string> work_dir = WorkDir("local");
  if (!work_dir.ok()) return Fail(work_dir.status());
  o.work_dir = *work_dir;
  o.num_servers = absl::GetFlag(FLAGS_servers);
  // After LocalCluster's own --listen=127.0.0.1:0: the last one counts.
  o.scheduler_flags = {
      absl::StrCat("--listen=", absl::GetFlag(FLAGS_listen)),
      absl::StrCat("--consistency=", absl::GetFlag(FLAGS_consistency)),
      absl::StrCat("--staleness=", absl::GetFlag(FLAGS_staleness)),
      absl::StrCat("--num_workers=", absl::GetFlag(FLAGS_num_workers)),
      absl::StrCat("--backup_workers=", absl::GetFlag(FLAGS_backup_workers)),
      absl::StrCat("--replicas=", absl::GetFlag(FLAGS_replicas))};
  if (absl::GetFlag(FLAGS_metrics)) {
    o.scheduler_flags.push_back("--metrics_listen=127.0.0.1:0");
    o.server_flags.push_back("--metrics_listen=127.0.0.1:0");
  }
  o.cluster_secret_file = SecretFile();
  absl::Notification stop;
  TerminationHandler on_signal = OnTerminationSignal([&stop] {
    if (!stop.HasBeenNotified()) stop.Notify();
  });
  auto cluster = LocalCluster::Start(o);
  if (!cluster.ok()) return Fail(cluster.status());
  const std::string address = (*cluster)->scheduler_address();
  if (!absl::GetFlag(FLAGS_address_file).empty()) {
    if (absl::Status s =
            WriteAddressFile(absl::GetFlag(FLAGS_address_file), address);
        !s.ok()) {
      (void)(*cluster)->Stop();
      return Fail(s);
    }
  }
  psctl::LocalCluster running;
  running.set_scheduler(address);
  running.set_servers((*cluster)->num_servers());
  running.set_work_dir(o.work_dir);
  PrintOutput(running, ctx.format, [&](bool) {
    return absl::StrCat(
        "local cluster: scheduler ", address, ", ", running.servers(),
        " servers, logs in ", o.work_dir,
        "\n  psctl status --scheduler=", address,
        "\n  psctl job --scheduler=", address,
        " --worker_flags=--model=mlp,--steps=500\nCtrl-C stops it.\n");
  });
  // Until a signal, or until a daemon dies under us.
  while (!stop.WaitForNotificationWithTimeout(absl::Milliseconds(500))) {
    if (!(*cluster)->scheduler().running() ||
        (*cluster)->scheduler().Wait(absl::ZeroDuration()).ok()) {
      std::fprintf(stderr, "psctl: the scheduler exited; log: %s\n",
                   (*cluster)->scheduler().log_path().c_str());
      (void)(*cluster)->Stop();
      return kFailed;
    }
  }
  std::fprintf(ctx.machine() ? stderr : stdout, "stopping\n");
  absl::Status s = (*cluster)->Stop();
  if (!s.ok()) return Fail(s);
  return 0;
}

// Starts a job's processes against a running cluster and waits for them,
// printing the job's progress.
int Job(const CommandContext& ctx) {
  const std::string kind = absl::GetFlag(FLAGS_kind);
  if (kind != "train" && kind != "lbfgs") {
    std::fprintf(stderr, "psctl job: --kind=%s: train or lbfgs\n",
                 kind.c_str());
    return kUsage;
  }
  const std::string& scheduler = ctx.scheduler;
  const std::string bin = BinDir();
  absl::StatusOr<std::string> work_dir = WorkDir("job");
  if (!work_dir.ok()) return Fail(work_dir.status());
  const std::string dir = *work_dir;
  // Progress goes where it does not mix with a JSON or YAML result.
  FILE* progress = ctx.machine() ? stderr : stdout;
  SchedulerClient sched(scheduler,
                        absl::Milliseconds(absl::GetFlag(FLAGS_rpc_timeout_ms)),
                        ctx.auth);
  auto status = sched.GetJobStatus();
  if (!status.ok()) return Fail(status.status());
  int workers = absl::GetFlag(FLAGS_workers);
  if (workers <= 0) {
    workers = kind == "lbfgs"
                  ? 2
                  : static_cast<int>(status->job().num_workers() +
                                     status->job().backup_workers());
  }
  std::vector<std::unique_ptr<Subprocess>> procs;
  std::unique_ptr<Subprocess> coordinator;
  std::string coordinator_address;
  if (kind == "lbfgs") {
    const std::string address_file = dir + "/coordinator.address";
    std::remove(address_file.c_str());
    std::vector<std::string> argv = {bin + "/lbfgs/ps_lbfgs",
                                     "--scheduler=" + scheduler,
                                     "--address_file=" + address_file};
    for (const std::string& f : SecretFlag()) argv.push_back(f);
    for (const std::string& f : absl::GetFlag(FLAGS_lbfgs_flags))
      argv.push_back(f);
    coordinator = std::make_unique<Subprocess>(argv, dir + "/ps_lbfgs.log");
    if (absl::Status s = coordinator->Start(); !s.ok()) return Fail(s);
    auto address =
        WaitForAddressFile(address_file, absl::Minutes(2), coordinator.get());
    if (!address.ok()) {
      std::fprintf(stderr, "%s\n", coordinator->LogTail().c_str());
      return Fail(address.status());
    }
    coordinator_address = *address;
  }
  for (int i = 0; i < workers; ++i) {
    std::vector<std::string> argv = {
        bin + "/worker/ps_worker", "--scheduler=" + scheduler,
        absl::StrCat("--name=psctl-", getpid(), "-", i)};
    if (kind == "lbfgs") {
      argv.push_back("--job=lbfgs");
      argv.push_back("--coordinator=" + coordinator_address);
    }
    for (const std::string& f : SecretFlag()) argv.push_back(f);
    for (const std::string& f : absl::GetFlag(FLAGS_worker_flags))
      argv.push_back(f);
    procs.push_back(std::make_unique<Subprocess>(
        argv, absl::StrCat(dir, "/worker-", i, ".log")));
    if (absl::Status s = procs.back()->Start(); !s.ok()) return Fail(s);
  }
  std::fprintf(progress, "job (%s): %d workers, logs in %s\n", kind.c_str(),
               workers, dir.c_str());
  std::fflush(progress);
  absl::Notification stop;
  TerminationHandler on_signal = OnTerminationSignal([&stop] {
    if (!stop.HasBeenNotified()) stop.Notify();
  });
  const absl::Time deadline =
      absl::Now() + absl::Seconds(absl::GetFlag(FLAGS_job_timeout_s));
  std::vector<Subprocess*> all;
  for (auto& p : procs) all.push_back(p.get());
  if (coordinator != nullptr) all.push_back(coordinator.get());
  psctl::JobResult result;
  result.set_kind(kind);
  result.set_work_dir(dir);
  // Exit status as a shell reports it (128 + N for signal N).
  auto exit_status = [](int st) {
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
  };
  auto record = [&](const Subprocess& p, int status) {
    psctl::JobResult::Process* r = result.add_processes();
    r->set_program(p.argv()[0]);
    r->set_exit_status(status);
    r->set_log(p.log_path());
    if (status != 0) result.set_failed(result.failed() + 1);
  };
  std::vector<bool> done(all.size(), false);
  size_t remaining = all.size();
  while (remaining > 0) {
    if (stop.WaitForNotificationWithTimeout(absl::Seconds(1)) ||
        absl::Now() > deadline) {
      std::fprintf(stderr, "psctl job: %s; stopping the job\n",
                   stop.HasBeenNotified() ? "interrupted" : "timed out");
      for (Subprocess* p : all) {
        if (p->running()) p->Signal(SIGTERM);
      }
      for (size_t i = 0; i < all.size(); ++i) {
        if (done[i]) continue;
        auto st = all[i]->Wait(absl::Seconds(10));
        record(*all[i], st.ok() ? exit_status(*st) : 128 + SIGKILL);
      }
      result.set_interrupted(true);
      if (ctx.machine()) PrintOutput(result, ctx.format, nullptr);
      return kFailed;
    }
    for (size_t i = 0; i < all.size(); ++i) {
      if (done[i]) continue;
      auto st = all[i]->Wait(absl::ZeroDuration());
      if (!st.ok()) continue;
      done[i] = true;
      --remaining;
      record(*all[i], exit_status(*st));
      if (exit_status(*st) != 0) {
        std::fprintf(stderr, "psctl job: %s failed; log tail:\n%s\n",
                     all[i]->argv()[0].c_str(), all[i]->LogTail(2000).c_str());
      }
    }
    if (kind == "train") {
      auto s = sched.GetJobStatus();
      if (s.ok() && s->workers_size() > 0) {
        const auto& w0 = s->workers(0);
        std::fprintf(progress, "gating clock %lld  loss %.4f  test acc %s\n",
                     static_cast<long long>(s->gating_clock()), w0.loss(),
                     w0.test_accuracy() > 0
                         ? absl::StrCat(w0.test_accuracy()).c_str()
                         : "-");
        std::fflush(progress);
      }
    }
  }
  if (coordinator != nullptr) {
    // ps_lbfgs' summary is the end of its log.
    std::fprintf(progress, "%s\n", coordinator->LogTail(1500).c_str());
  }
  const int failed = result.failed();
  PrintOutput(result, ctx.format, [&](bool) {
    return failed > 0 ? std::string() : std::string("job done\n");
  });
  if (failed > 0) {
    std::fprintf(stderr, "psctl job: %d of %zu processes failed\n", failed,
                 all.size());
    return kFailed;
  }
  return 0;
}

std::string FormatManifest(const proto::CheckpointManifest& m, bool wide) {
  std::string out = absl::StrFormat(
      "checkpoint %llu  clock %lld  tables %d  rows %llu  bytes %llu  "
      "took %lld ms\n",
      static_cast<unsigned long long>(m.id()),
      static_cast<long long>(m.clock()), m.tables_size(),
      static_cast<unsigned long long>(m.rows()),
      static_cast<unsigned long long>(m.bytes()),
      static_cast<long long>(m.duration_ms()));
  if (!m.lbfgs().table().empty()) {
    absl::StrAppendFormat(
        &out, "  L-BFGS of table %s after iteration %d (f %.10g)\n",
        m.lbfgs().table(), m.lbfgs().iteration(), m.lbfgs().f());
  }
  if (wide) {
    for (const auto& t : m.tables()) {
      absl::StrAppend(&out, "  table ", t.spec().name(), "\n");
    }
  }
  return out;
}

// Takes a checkpoint now and waits for its manifest.
int Checkpoint(const CommandContext& ctx) {
  const absl::Duration timeout = absl::Seconds(absl::GetFlag(FLAGS_timeout_s));
  SchedulerClient sched(ctx.scheduler, timeout + absl::Seconds(10), ctx.auth);
  absl::StatusOr<proto::CheckpointManifest> m = sched.Checkpoint(timeout);
  if (!m.ok()) return Fail(m.status());
  return PrintOutput(*m, ctx.format,
                     [&](bool wide) { return FormatManifest(*m, wide); });
}

// The complete checkpoints the scheduler keeps, oldest first.
int Checkpoints(const CommandContext& ctx) {
  SchedulerClient sched(ctx.scheduler,
                        absl::Milliseconds(absl::GetFlag(FLAGS_rpc_timeout_ms)),
                        ctx.auth);
  absl::StatusOr<std::vector<proto::CheckpointManifest>> all =
      sched.ListCheckpoints();
  if (!all.ok()) return Fail(all.status());
  proto::ListCheckpointsReply reply;
  for (const auto& m : *all) *reply.add_checkpoints() = m;
  return PrintOutput(reply, ctx.format, [&](bool wide) {
    if (all->empty()) return std::string("no complete checkpoint\n");
    std::string out;
    for (const auto& m : *all) out += FormatManifest(m, wide);
    return out;
  });
}

// Drains server NAME (its ranges move to the others, then it leaves and
// exits 0) and waits for it; or calls its drain off (--cancel).
int Drain(const CommandContext& ctx) {
  if (ctx.args.size() != 1) {
    std::fprintf(stderr,
                 "psctl drain: name the server (psctl drain NAME; psctl "
                 "status lists them)\n");
    return kUsage;
  }
  const absl::Duration timeout = absl::Seconds(absl::GetFlag(FLAGS_timeout_s));
  SchedulerClient sched(ctx.scheduler,
                        absl::Milliseconds(absl::GetFlag(FLAGS_rpc_timeout_ms)),
                        ctx.auth);
  proto::DrainRequest req;
  req.set_name(ctx.args[0]);
  req.set_cancel(absl::GetFlag(FLAGS_cancel));
  FILE* progress = ctx.machine() ? stderr : stdout;
  const absl::Time start = absl::Now();
  const absl::Time deadline = start + timeout;
  absl::StatusOr<proto::DrainReply> r = sched.Drain(req);
  if (!r.ok()) return Fail(r.status());
  uint32_t last_held = UINT32_MAX;
  // The drain is asked again (idempotent) for its progress until the
  // server has left.
  while (!req.cancel() && !r->left() && r->draining() &&
         absl::Now() < deadline) {
    if (r->ranges_held() != last_held) {
      last_held = r->ranges_held();
      std::fprintf(progress, "%s: %u range(s) left, %u moving\n",
                   r->name().c_str(), r->ranges_held(), r->moves_under_way());
      std::fflush(progress);
    }
    absl::SleepFor(absl::Milliseconds(200));
    r = sched.Drain(req);
    if (!r.ok()) return Fail(r.status());
  }
  psctl::DrainProgress out;
  out.set_server(r->name());
  out.set_node_id(r->node_id());
  out.set_draining(r->draining());
  out.set_ranges_held(r->ranges_held());
  out.set_moves_under_way(r->moves_under_way());
  out.set_left(r->left());
  out.set_waited_seconds(absl::ToDoubleSeconds(absl::Now() - start));
  const int printed = PrintOutput(out, ctx.format, [&](bool) {
    if (req.cancel()) {
      return absl::StrFormat("%s: drain called off; it holds %u range(s)\n",
                             out.server(), out.ranges_held());
    }
    if (out.left()) {
      return absl::StrFormat("%s: drained and left the cluster after %.1f s\n",
                             out.server(), out.waited_seconds());
    }
    return std::string();
  });
  if (req.cancel() || out.left()) return printed;
  return Fail(absl::DeadlineExceededError(
      out.draining()
          ? absl::StrCat("server '", out.server(), "' still holds ",
                         out.ranges_held(), " range(s) after ",
                         absl::FormatDuration(timeout),
                         "; the drain goes on (psctl drain --cancel calls it "
                         "off)")
          : absl::StrCat("the drain of server '", out.server(),
                         "' was called off (the scheduler is stopping, or "
                         "someone cancelled it)")));
}

// Removes the worker of rank RANK from the job for good and waits for it.
int Retire(const CommandContext& ctx) {
  int rank = -1;
  if (ctx.args.size() != 1 || !absl::SimpleAtoi(ctx.args[0], &rank)) {
    std::fprintf(stderr,
                 "psctl retire: name the worker's rank (psctl retire RANK; "
                 "psctl status lists them)\n");
    return kUsage;
  }
  const absl::Duration timeout = absl::Seconds(absl::GetFlag(FLAGS_timeout_s));
  SchedulerClient sched(ctx.scheduler,
                        absl::Milliseconds(absl::GetFlag(FLAGS_rpc_timeout_ms)),
                        ctx.auth);
  FILE* progress = ctx.machine() ? stderr : stdout;
  const absl::Time start = absl::Now();
  const absl::Time deadline = start + timeout;
  absl::StatusOr<proto::RetireWorkerReply> r = sched.RetireWorker(rank);
  if (!r.ok()) return Fail(r.status());
  if (!r->retired()) {
    std::fprintf(progress, "rank %d: worker '%s' asked to leave for good\n",
                 rank, r->name().c_str());
    std::fflush(progress);
  }
  // Asked again (idempotent) until the worker has left: the request is not
  // durable, so a scheduler restarted meanwhile hears it again.
  while (!r->retired() && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(200));
    r = sched.RetireWorker(rank);
    if (!r.ok()) return Fail(r.status());
  }
  psctl::RetireProgress out;
  out.set_rank(rank);
  out.set_worker(r->name());
  out.set_node_id(r->node_id());
  out.set_retired(r->retired());
  out.set_waited_seconds(absl::ToDoubleSeconds(absl::Now() - start));
  const int printed = PrintOutput(out, ctx.format, [&](bool) {
    return out.retired() ? absl::StrFormat(
                               "rank %d: retired (worker '%s') after %.1f s\n",
                               rank, out.worker(), out.waited_seconds())
                         : std::string();
  });
  if (out.retired()) return printed;
  return Fail(absl::DeadlineExceededError(absl::StrCat(
      "worker '", out.worker(), "' of rank ", rank, " has not left after ",
      absl::FormatDuration(timeout),
      " (it leaves after its step; a worker that never checks stays)")));
}

// psctl split and psctl merge: one asks for a split, the other for a
// merge, and both wait until the map shows it done or called off.
int SplitOrMerge(const CommandContext& ctx, bool merge) {
  const char* verb = merge ? "merge" : "split";
  uint64_t key = 0;
  if (ctx.args.size() != 2 || !absl::SimpleAtoi(ctx.args[1], &key)) {
    std::fprintf(stderr,
                 merge ? "psctl merge: name the table and a key of the lower "
                         "of the two ranges (psctl merge TABLE KEY; psctl "
                         "tables lists the ranges)\n"
                       : "psctl split: name the table and the key that "
                         "begins the upper half (psctl split TABLE KEY; "
                         "psctl tables lists the ranges)\n");
    return kUsage;
  }
  const absl::Duration timeout = absl::Seconds(absl::GetFlag(FLAGS_timeout_s));
  SchedulerClient sched(ctx.scheduler,
                        absl::Milliseconds(absl::GetFlag(FLAGS_rpc_timeout_ms)),
                        ctx.auth);
  proto::SplitRangeRequest req;
  req.set_table(ctx.args[0]);
  req.set_key(key);
  req.set_merge(merge);
  const absl::Time start = absl::Now();
  const absl::Time deadline = start + timeout;
  absl::StatusOr<proto::SplitRangeReply> r = sched.SplitRange(req);
  if (!r.ok()) return Fail(r.status());
  psctl::SplitProgress out;
  out.set_table(req.table());
  out.set_begin(r->begin());
  out.set_end(r->end());
  out.set_split_at(r->split_at());
  out.set_merge(merge);
  const Key at = r->split_at();
  // The map tells how it ends. A split: a range now begins at the key
  // (done), or the range holding it is no longer being split (called
  // off). A merge: a range spans [begin, end) (done), or the lower range
  // still ends at the boundary and is no longer being merged (called off).
  enum { kUnderWay, kDone, kCancelled } state = kUnderWay;
  while (state == kUnderWay) {
    absl::StatusOr<proto::ClusterMap> map = sched.GetClusterMap();
    if (!map.ok()) return Fail(map.status());
    out.set_epoch(map->epoch());
    for (const proto::TableMap& t : map->tables()) {
      if (t.spec().id() != r->table_id()) continue;
      for (const proto::RangeAssignment& a : t.ranges()) {
        if (merge) {
          if (a.begin() == r->begin() && a.end() == r->end()) state = kDone;
          if (a.begin() == r->begin() && a.end() == at &&
              a.merge() != proto::RangeAssignment::MERGE_WITH_NEXT) {
            state = kCancelled;
          }
          continue;
        }
        if (a.begin() == at) state = kDone;
        if (a.begin() < at && at < a.end() && a.split_at() != at) {
          state = kCancelled;
        }
      }
    }
    if (state != kUnderWay || absl::Now() >= deadline) break;
    absl::SleepFor(absl::Milliseconds(100));
  }
  out.set_done(state == kDone);
  out.set_waited_seconds(absl::ToDoubleSeconds(absl::Now() - start));
  if (state == kCancelled) {
    return Fail(absl::AbortedError(
        absl::StrCat(verb, " of table '", req.table(), "' keys [", out.begin(),
                     ", ", out.end(), ") at key ", at,
                     ": called off (a holder died or a copy started; retry)")));
  }
  const int printed = PrintOutput(out, ctx.format, [&](bool) {
    return out.done() ? absl::StrFormat(
                            "table '%s' keys [%d, %d): %s at key %d "
                            "after %.1f s (epoch %d)\n",
                            out.table(), out.begin(), out.end(),
                            merge ? "merged" : "split", at,
                            out.waited_seconds(), out.epoch())
                      : std::string();
  });
  if (out.done()) return printed;
  return Fail(absl::DeadlineExceededError(
      absl::StrCat(verb, " of table '", req.table(), "' at key ", at,
                   " not done after ", absl::FormatDuration(timeout))));
}

// Rolls the job back to --checkpoint and waits for it.
int Restore(const CommandContext& ctx) {
  const uint64_t id = absl::GetFlag(FLAGS_checkpoint);
  if (id == 0) {
    std::fprintf(stderr,
                 "psctl restore: needs --checkpoint=ID (psctl checkpoints "
                 "lists them)\n");
    return kUsage;
  }
  const absl::Duration timeout = absl::Seconds(absl::GetFlag(FLAGS_timeout_s));
  SchedulerClient sched(ctx.scheduler, timeout + absl::Seconds(10), ctx.auth);
  absl::StatusOr<proto::RestoreCheckpointReply> r =
      sched.RestoreCheckpoint(id, timeout);
  if (!r.ok()) return Fail(r.status());
  return PrintOutput(*r, ctx.format, [&](bool) {
    return absl::StrFormat(
        "restored checkpoint %llu: the job resumes at clock %lld "
        "(epoch %llu)\n",
        static_cast<unsigned long long>(r->manifest().id()),
        static_cast<long long>(r->manifest().clock()),
        static_cast<unsigned long long>(r->epoch()));
  });
}

// One table's parameters to .npy, from the cluster or a checkpoint.
int Export(const CommandContext& ctx) {
  ExportOptions o;
  o.table = absl::GetFlag(FLAGS_table);
  o.out = absl::GetFlag(FLAGS_out);
  if (o.table.empty() || o.out.empty()) {
    std::fprintf(stderr, "psctl export: needs --table and --out\n");
    return kUsage;
  }
  const std::vector<std::string> dirs = absl::GetFlag(FLAGS_data_dirs);
  absl::StatusOr<ExportResult> r =
      dirs.empty()
          ? ExportFromCluster(ctx.scheduler, ctx.auth, o)
          : ExportFromCheckpoint(dirs, absl::GetFlag(FLAGS_checkpoint), o);
  if (!r.ok()) return Fail(r.status());
  psctl::ExportSummary summary;
  summary.set_table(o.table);
  summary.set_rows(r->rows);
  summary.set_width(r->width);
  summary.set_sparse(r->sparse);
  for (const std::string& f : r->files) summary.add_files(f);
  return PrintOutput(summary, ctx.format, [&](bool) {
    return absl::StrFormat("%s: %llu rows of width %u%s -> %s\n", o.table,
                           static_cast<unsigned long long>(r->rows), r->width,
                           r->sparse ? " (sparse)" : "",
                           absl::StrJoin(r->files, ", "));
  });
}

int Version(const CommandContext& ctx) {
  psctl::VersionInfo v;
  v.set_version(kVersion);
  return PrintOutput(v, ctx.format, [&](bool) {
    return absl::StrCat("psctl ", v.version(), "\n");
  });
}

// Every command: a row here, its function above (or in a file of its own
// beside this one).
struct Command {
  const char* name;
  int (*run)(const CommandContext&);
  int max_args = 0;  // positional arguments after the command
};
constexpr Command kCommands[] = {
    {"status", [](const CommandContext& c) { return PrintStatus(false, c); }},
    {"tables", [](const CommandContext& c) { return PrintStatus(true, c); }},
    {"local", Local},
    {"job", Job},
    {"drain", Drain, 1},
    {"retire", Retire, 1},
    {"split", [](const CommandContext& c) { return SplitOrMerge(c, false); },
     2},
    {"merge", [](const CommandContext& c) { return SplitOrMerge(c, true); }, 2},
    {"checkpoint", Checkpoint},
    {"checkpoints", Checkpoints},
    {"restore", Restore},
    {"export", Export},
    {"version", Version},
    {"calibrate",
     [](const CommandContext& c) { return CalibrateCommand(c.auth); }},
    {"plan",
     [](const CommandContext& c) {
       return PlanCommand(c.format == OutputFormat::kJson);
     }},
};

std::string CommandNames(const char* separator) {
  std::vector<std::string> names;
  for (const Command& c : kCommands) names.push_back(c.name);
  return absl::StrJoin(names, separator);
}

// --scheduler, else $DOWNPOUR_SCHEDULER (the variable python3 -m
// downpour.run and the Kubernetes Python workers set), else the default.
std::string SchedulerAddress() {
  std::string address = absl::GetFlag(FLAGS_scheduler);
  if (address.empty()) {
    const char* env = std::getenv("DOWNPOUR_SCHEDULER");
    address = env != nullptr && *env != '\0' ? env : "127.0.0.1:7070";
  }
  return address;
}

int Main(const std::vector<char*>& args) {
  if (args.size() < 2) {
    std::fprintf(stderr, "usage: psctl %s [flags] (psctl --help)\n",
                 CommandNames("|").c_str());
    return kUsage;
  }
  const std::string command = args[1];
  CommandContext ctx;
  ctx.scheduler = SchedulerAddress();
  const std::string o =
      absl::GetFlag(FLAGS_json) ? "json" : absl::GetFlag(FLAGS_o);
  absl::StatusOr<OutputFormat> format = ParseOutputFormat(o);
  if (!format.ok()) {
    std::fprintf(stderr, "psctl: -o: %s\n",
                 std::string(format.status().message()).c_str());
    return kUsage;
  }
  ctx.format = *format;
  for (const Command& c : kCommands) {
    if (command != c.name) continue;
    ctx.args.assign(args.begin() + 2, args.end());
    if (static_cast<int>(ctx.args.size()) > c.max_args) {
      std::fprintf(stderr,
                   "psctl %s: unexpected argument '%s' (psctl --help)\n",
                   c.name, ctx.args[c.max_args].c_str());
      return kUsage;
    }
    auto auth = ClusterAuth::FromFlags(kGrpcClient);
    if (!auth.ok()) return Fail(auth.status());
    ctx.auth = *std::move(auth);
    return c.run(ctx);
  }
  std::fprintf(stderr, "psctl: unknown command '%s' (%s)\n", command.c_str(),
               CommandNames(", ").c_str());
  return kUsage;
}

}  // namespace
}  // namespace downpour

int main(int argc, char** argv) {
  downpour::ProgramStart start;
  start.usage =
      "the Downpour operator's command line (usage: psctl "
      "status|tables|local|job|drain NAME|checkpoint|checkpoints|restore|"
      "export|version|calibrate|plan [--scheduler=HOST:PORT] "
      "[-o json|yaml|wide] [flags])";
  start.block_termination_signals = true;
  // `plan` takes --workers and --servers as ranges, which the flag parser
  // (integers, for `local` and `job`) would refuse.
  downpour::TakePlanRanges(&argc, argv);
  auto args = downpour::StartProgram(argc, argv, start);
  if (!args.ok()) return 2;
  return downpour::Main(*args);
}
