// psctl calibrate: measures what the performance model needs (compute on
// this host, the data plane against one server of a local or live cluster,
// the handlers' apply costs), prints every figure with its spread and
// saves them (planner/calibration.h). See psctl/planning.h.
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "absl/flags/declare.h"
#include "absl/flags/flag.h"
#include "absl/flags/reflection.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "client/client.h"
#include "cluster/scheduler_client.h"
#include "common/status_macros.h"
#include "launch/local_cluster.h"
#include "planner/calibration.h"
#include "planner/model_spec.h"
#include "psctl/compute_probe.h"
#include "psctl/network_probe.h"
#include "psctl/planning.h"

ABSL_FLAG(double, probe_seconds, 0.25,
          "calibrate: seconds of each probe per round");
ABSL_FLAG(int32_t, probe_rounds, 5,
          "calibrate: rounds of each probe (the spread is over rounds)");
ABSL_FLAG(int32_t, message_kb, 128,
          "calibrate: size of the large pushes and pulls, in KiB (128: the "
          "part a BSP worker sends as its backward pass completes it)");
ABSL_FLAG(int32_t, in_flight, 4,
          "calibrate: requests in flight for the pipelined figures");
ABSL_FLAG(bool, cores_only, false,
          "calibrate: measure again only the cores this host gives (its "
          "other users' load changes them) in the existing --calibration "
          "file, e.g. right before a job on a shared host");

// plan.cc and main.cc.
ABSL_DECLARE_FLAG(std::string, model);
ABSL_DECLARE_FLAG(std::string, calibration);
ABSL_DECLARE_FLAG(std::string, scheduler);
ABSL_DECLARE_FLAG(std::string, bin_dir);
ABSL_DECLARE_FLAG(std::string, work_dir);
ABSL_DECLARE_FLAG(int64_t, rpc_timeout_ms);

namespace downpour {
namespace {

constexpr int kFailed = 1;
constexpr int kUsage = 2;

int Fail(const absl::Status& s) {
  std::fprintf(stderr, "psctl calibrate: %s\n",
               std::string(s.message()).c_str());
  return kFailed;
}

bool Changed(const char* name) {
  const absl::CommandLineFlag* f = absl::FindCommandLineFlag(name);
  return f != nullptr && f->CurrentValue() != f->DefaultValue();
}

std::string Figure(const planner::Spread& s, const char* unit,
                   const char* format = "%.2f") {
  return absl::StrCat(absl::StrFormat(format, s.median), " ", unit, " (p10 ",
                      absl::StrFormat(format, s.p10), ", p90 ",
                      absl::StrFormat(format, s.p90), ", ", s.samples,
                      " samples)");
}

std::string Describe(const planner::Calibration& c) {
  std::string out;
  const planner::ComputeCalibration& k = c.compute;
  absl::StrAppend(
      &out, "calibration of ", c.cluster.host, " (", c.cluster.cpu_model, ", ",
      c.cluster.cores, " cores), cluster ", c.cluster.scheduler, ", ",
      c.created, "\ncompute, one thread:\n  GEMM 512x512x512      ",
      Figure(k.gemm_peak_gflops, "GFLOP/s"), "\n  memory copy           ",
      Figure(k.memory_gbs, "GB/s"), "\n  step spread (cv)      ",
      absl::StrFormat("%.3f", k.step_cv), "\n  cores given to k busy threads:");
  for (const auto& [t, cores] : k.effective_cores) {
    absl::StrAppendFormat(&out, " %d: %.2f;", t, cores);
  }
  out += "\n";
  for (const planner::LayerRate& l : k.layers) {
    absl::StrAppendFormat(&out, "  layer %dx%dx%d (batch x in x out):\n",
                          l.batch, l.in, l.out);
    absl::StrAppend(
        &out, "    forward             ", Figure(l.fwd_gflops, "GFLOP/s"), "\n",
        "    weight gradient     ", Figure(l.wgrad_gflops, "GFLOP/s"), "\n",
        "    input gradient      ", Figure(l.dgrad_gflops, "GFLOP/s"), "\n");
  }
  for (const planner::StepTime& t : k.steps) {
    absl::StrAppend(&out, "  whole step, layers ",
                    absl::StrJoin(t.layer_sizes, "-"), ", batch ", t.batch,
                    ": ", Figure(t.ms, "ms", "%.3f"), "\n");
    if (t.streamed_ms.samples > 0) {
      absl::StrAppend(&out,
                      "    its parts sent to the server as they finish (BSP): ",
                      Figure(t.streamed_ms, "ms", "%.3f"), "\n");
    }
    if (t.streamed_cpu_ms > 0) {
      absl::StrAppend(&out, "    CPU of such a step, its replies included: ",
                      absl::StrFormat("%.3f ms here", t.streamed_cpu_ms),
                      t.streamed_server_cpu_ms > 0
                          ? absl::StrFormat(", %.3f ms in the server",
                                            t.streamed_server_cpu_ms)
                          : std::string(),
                      "\n");
    }
  }
  const planner::NetworkCalibration& n = c.network;
  absl::StrAppend(
      &out, "data plane, one server:\n  latency (4-byte pull) ",
      Figure(n.latency_us, "us", "%.0f"), "\n",
      absl::StrFormat("  push %d KiB, 1 in flight ", n.message_bytes >> 10),
      Figure(n.push_gbs_1, "GB/s"), "\n",
      absl::StrFormat("  push, %d in flight      ", n.in_flight),
      Figure(n.push_gbs_k, "GB/s"), "\n",
      absl::StrFormat("  pull %d KiB, 1 in flight ", n.message_bytes >> 10),
      Figure(n.pull_gbs_1, "GB/s"), "\n",
      absl::StrFormat("  pull, %d in flight      ", n.in_flight),
      Figure(n.pull_gbs_k, "GB/s"), "\n",
      absl::StrFormat("  4-byte pulls, %d in flight: %.1fk/s\n", n.in_flight,
                      n.small_pulls_per_s_k / 1e3),
      absl::StrFormat("  CPU, client: %.1f us/request, %.3f ns/byte pushed, "
                      "%.3f ns/byte pulled\n",
                      n.client_us_per_request, n.client_ns_per_push_byte,
                      n.client_ns_per_pull_byte),
      absl::StrFormat("  of which the calling thread: %.1f us/request, "
                      "%.3f ns/byte\n",
                      n.caller_us_per_request, n.caller_ns_per_byte),
      absl::StrFormat("  CPU, server (%s): %.1f us/request, %.3f ns/byte "
                      "pushed (apply excluded), %.3f ns/byte pulled\n",
                      n.server_cpu_source, n.server_us_per_request,
                      n.server_ns_per_push_byte, n.server_ns_per_pull_byte),
      absl::StrFormat("  of which its busiest thread (served in turn): "
                      "%.0f%%\n",
                      100 * n.server_serial_fraction),
      absl::StrFormat("  a BSP request held for aggregation costs the "
                      "server %.1f us more\n",
                      n.server_us_per_held_request),
      absl::StrFormat("  control call (gRPC to the scheduler): %.0f us round "
                      "trip, CPU %.1f us here, %.1f us in the scheduler\n",
                      n.control_latency_us, n.control_client_us,
                      n.control_scheduler_us),
      "apply, ns per float:\n");
  for (const auto& [h, s] : c.apply_ns_per_float) {
    absl::StrAppendFormat(&out, "  %-20s  %s\n", h, Figure(s, "ns", "%.3f"));
  }
  return out;
}

std::string NowUtc() {
  return absl::FormatTime("%Y-%m-%dT%H:%M:%SZ", absl::Now(),
                          absl::UTCTimeZone());
}

}  // namespace

int CalibrateCommand(const ClusterAuth& auth) {
  ProbeOptions probe;
  probe.seconds = absl::GetFlag(FLAGS_probe_seconds);
  probe.rounds = absl::GetFlag(FLAGS_probe_rounds);
  const int message_kb = absl::GetFlag(FLAGS_message_kb);
  const int in_flight = absl::GetFlag(FLAGS_in_flight);
  const std::string out = absl::GetFlag(FLAGS_calibration);
  if (probe.seconds <= 0 || probe.rounds < 1 || message_kb < 1 ||
      in_flight < 1 || out.empty()) {
    std::fprintf(stderr,
                 "psctl calibrate: --probe_seconds > 0, --probe_rounds, "
                 "--message_kb and --in_flight >= 1, and --calibration=FILE "
                 "are needed\n");
    return kUsage;
  }
  if (absl::GetFlag(FLAGS_cores_only)) {
    absl::StatusOr<planner::Calibration> old = planner::ReadCalibration(out);
    if (!old.ok()) return Fail(old.status());
    if (absl::Status s =
            planner::CheckCluster(*old, planner::ThisHost(), "",
                                  absl::StrCat("calibration file '", out, "'"));
        !s.ok()) {
      return Fail(s);
    }
    old->compute.effective_cores =
        EffectiveCores(static_cast<int>(old->cluster.cores), probe.seconds);
    if (absl::Status s = planner::WriteCalibration(out, *old); !s.ok()) {
      return Fail(s);
    }
    std::printf("cores given to k busy threads:");
    for (const auto& [t, cores] : old->compute.effective_cores) {
      std::printf(" %d: %.2f;", static_cast<int>(t), cores);
    }
    std::printf("\nwritten to %s\n", out.c_str());
    return 0;
  }
  planner::Calibration c;
  c.created = NowUtc();
  c.cluster = planner::ThisHost();
  const bool live = Changed("scheduler");
  c.cluster.scheduler = live ? absl::GetFlag(FLAGS_scheduler) : "local";

  // The model's layers, when given, are measured at its batch size.
  planner::ModelSpec model;
  std::set<std::string> handlers = {"sum", "sgd", "momentum", "adagrad",
                                    "adam"};
  if (!absl::GetFlag(FLAGS_model).empty()) {
    absl::StatusOr<planner::ModelSpec> m =
        planner::ReadModelSpec(absl::GetFlag(FLAGS_model));
    if (!m.ok()) return Fail(m.status());
    model = *m;
    for (planner::Mode mode : planner::kAllModes) {
      handlers.insert(model.HandlerFor(mode));
    }
  }

  std::fprintf(stderr, "calibrating compute ...\n");
  c.compute.gemm_peak_gflops = GemmPeakGflops(probe);
  c.compute.memory_gbs = MemoryGbs(probe);
  c.compute.effective_cores =
      EffectiveCores(static_cast<int>(c.cluster.cores), probe.seconds);
  for (int l = 0; l < model.num_layers(); ++l) {
    const int64_t in = model.layer_sizes[l], o = model.layer_sizes[l + 1];
    if (c.compute.FindLayer(model.batch, in, o) == nullptr) {
      c.compute.layers.push_back(MeasureLayer(model.batch, in, o, probe));
    }
  }
  if (model.num_layers() > 0) {
    c.compute.steps.push_back(MeasureStep(model, probe));
  }
  // Without a model, the spread of the MLP's step stands in.
  planner::ModelSpec cv_model = model;
  if (cv_model.num_layers() == 0) {
    cv_model.batch = 64;
    cv_model.layer_sizes = {784, 256, 10};
  }
  c.compute.step_cv = StepCv(cv_model, 400);
  for (const std::string& h : handlers) {
    absl::StatusOr<planner::Spread> s = ApplyNsPerFloat(h, probe);
    if (!s.ok()) return Fail(s.status());
    c.apply_ns_per_float[h] = *s;
  }

  std::unique_ptr<LocalCluster> cluster;
  NetworkProbeOptions no;
  no.probe = probe;
  no.message_bytes = size_t{static_cast<size_t>(message_kb)} << 10;
  no.in_flight = in_flight;
  no.sgd_ns_per_float = c.apply_ns_per_float["sgd"].median;
  std::string scheduler = absl::GetFlag(FLAGS_scheduler);
  if (live) {
    SchedulerClient sched(
        scheduler, absl::Milliseconds(absl::GetFlag(FLAGS_rpc_timeout_ms)),
        auth);
    absl::StatusOr<proto::ClusterMap> map = sched.GetClusterMap();
    if (!map.ok()) return Fail(map.status());
    no.servers = 0;
    for (const proto::NodeInfo& n : map->nodes()) {
      no.servers += n.role() == proto::SERVER && n.state() == proto::ALIVE;
    }
    if (no.servers == 0) {
      return Fail(absl::FailedPreconditionError(absl::StrCat(
          "the cluster at ", scheduler, " has no live server to measure")));
    }
  } else {
    std::fprintf(stderr, "starting a local cluster (1 server) ...\n");
    LocalClusterOptions lo;
    lo.bin_dir = absl::GetFlag(FLAGS_bin_dir).empty()
                     ? BinDirOfThisProgram()
                     : absl::GetFlag(FLAGS_bin_dir);
    lo.work_dir = absl::GetFlag(FLAGS_work_dir).empty()
                      ? absl::StrCat("/tmp/psctl-calibrate-", getpid())
                      : absl::GetFlag(FLAGS_work_dir);
    std::system(("mkdir -p '" + lo.work_dir + "'").c_str());
    lo.num_servers = 1;
    // A one-worker job that the control probe joins.
    lo.scheduler_flags = {"--consistency=asp", "--num_workers=1"};
    const absl::CommandLineFlag* secret =
        absl::FindCommandLineFlag("cluster_secret_file");
    if (secret != nullptr) lo.cluster_secret_file = secret->CurrentValue();
    absl::StatusOr<std::unique_ptr<LocalCluster>> started =
        LocalCluster::Start(lo);
    if (!started.ok()) return Fail(started.status());
    cluster = *std::move(started);
    scheduler = cluster->scheduler_address();
    no.server = cluster->server(0).pid();
  }
  std::fprintf(stderr, "calibrating the data plane against %s ...\n",
               scheduler.c_str());
  absl::Status failed;
  {
    ClientOptions co;
    co.scheduler_address = scheduler;
    co.auth = auth;
    absl::StatusOr<std::unique_ptr<Client>> client = Client::Connect(co);
    if (!client.ok()) {
      failed = client.status();
    } else {
      absl::StatusOr<std::unique_ptr<Client>> second = Client::Connect(co);
      absl::StatusOr<planner::NetworkCalibration> n =
          second.ok()
              ? ProbeNetwork(**client, **second, no)
              : absl::StatusOr<planner::NetworkCalibration>(second.status());
      if (n.ok()) {
        c.network = *n;
        failed =
            ProbeControl(scheduler, auth,
                         cluster != nullptr ? cluster->scheduler().pid() : -1,
                         probe, &c.network);
        // Only against the local cluster: a live cluster's job is not ours
        // to add synchronous tables to.
        if (failed.ok() && model.num_layers() > 0 && cluster != nullptr) {
          absl::StatusOr<StreamedStep> streamed =
              ProbeStreamedStep(**client, model, probe, no.server);
          if (streamed.ok()) {
            planner::StepTime& t = c.compute.steps.back();
            t.streamed_ms = streamed->ms;
            t.streamed_cpu_ms = streamed->cpu_ms;
            t.streamed_server_cpu_ms = streamed->server_cpu_ms;
          } else {
            failed = streamed.status();
          }
        }
      } else {
        failed = n.status();
      }
    }
  }
  if (cluster != nullptr) {
    absl::Status s = cluster->Stop();
    if (failed.ok()) failed = s;
  }
  if (!failed.ok()) return Fail(failed);
  if (absl::Status s = planner::WriteCalibration(out, c); !s.ok()) {
    return Fail(s);
  }
  std::printf("%swritten to %s\n", Describe(c).c_str(), out.c_str());
  return 0;
}

}  // namespace downpour
