// psctl plan: the performance model over a grid of configurations, as a
// table (or JSON), a recommendation and a plot. See psctl/planning.h.
#include "planner/plan.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "absl/flags/declare.h"
#include "absl/flags/flag.h"
#include "absl/flags/reflection.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "planner/calibration.h"
#include "planner/model_spec.h"
#include "psctl/cluster_status.h"
#include "psctl/planning.h"

ABSL_FLAG(std::string, model, "",
          "plan, calibrate: the model file (JSON: batch, dense_layers, "
          "embeddings, handler; docs/OPERATIONS.md, \"Sizing a job\")");
ABSL_FLAG(std::string, calibration, "calibration.json",
          "calibrate: where to write the measurements; plan: the file to "
          "read");
ABSL_FLAG(std::string, modes, "bsp,ssp,asp", "plan: the modes to compare");
ABSL_FLAG(std::string, placement, "shared",
          "plan: shared (every process on the calibrated host, as psctl "
          "local runs them) or dedicated (one host per worker and server)");
ABSL_FLAG(int32_t, cores, 0,
          "plan, shared placement: cores of the host (0: the calibration's)");
ABSL_FLAG(double, nic_gbps, 0,
          "plan, dedicated placement: each host's link in GB/s (0: the "
          "calibrated rate with several requests in flight)");
ABSL_FLAG(std::string, plot, "",
          "plan: also draw predicted examples/s against workers to this PNG "
          "(gnuplot)");
ABSL_FLAG(bool, allow_other_cluster, false,
          "plan: use a calibration measured on another host or cluster");

// psctl's own flags (main.cc).
ABSL_DECLARE_FLAG(std::string, scheduler);
ABSL_DECLARE_FLAG(int64_t, staleness);
ABSL_DECLARE_FLAG(int32_t, backup_workers);

namespace downpour {
namespace {

constexpr int kFailed = 1;
constexpr int kUsage = 2;
// SSP's bound when --staleness is left at psctl local's default (0, which
// would make SSP gate like BSP): ps_demo's default.
constexpr int kPlanDefaultStaleness = 3;

// What TakePlanRanges found in argv (main() runs it before any thread).
std::string& WorkerRanges() {
  static std::string* s = new std::string("1..8");
  return *s;
}
std::string& ServerRanges() {
  static std::string* s = new std::string("1..4");
  return *s;
}

int Fail(const absl::Status& s) {
  std::fprintf(stderr, "psctl plan: %s\n", std::string(s.message()).c_str());
  return kFailed;
}

// Whether flag `name` was set to something else than its default.
bool Changed(const char* name) {
  const absl::CommandLineFlag* f = absl::FindCommandLineFlag(name);
  return f != nullptr && f->CurrentValue() != f->DefaultValue();
}

std::string Rate(double v) {
  if (v >= 1e6) return absl::StrFormat("%.2fM", v / 1e6);
  if (v >= 1e4) return absl::StrFormat("%.1fk", v / 1e3);
  return absl::StrFormat("%.0f", v);
}

std::string Megabytes(double bytes) {
  return absl::StrFormat("%.2f MB", bytes / 1e6);
}

std::string HumanPlan(const planner::Plan& plan, const planner::ModelSpec& m,
                      const planner::Calibration& c,
                      const std::string& calibration_path) {
  using planner::Prediction;
  std::string out;
  const planner::ComputeEstimate e = planner::WorkerCompute(m, c.compute);
  absl::StrAppendFormat(
      &out,
      "model %s: %d dense parameters (%s each way per worker step), %d "
      "embedding tables, batch %d per worker\n",
      m.name, m.DenseFloats(), Megabytes(4.0 * m.DenseFloats()),
      m.embeddings.size(), m.batch);
  absl::StrAppendFormat(&out,
                        "calibration %s: %s (%s, %d cores), cluster %s, %s\n",
                        calibration_path, c.cluster.host, c.cluster.cpu_model,
                        c.cluster.cores, c.cluster.scheduler, c.created);
  absl::StrAppendFormat(
      &out,
      "worker compute per step: %.2f ms (forward %.2f, backward %.2f, "
      "memory %.2f)%s%s; step spread (cv) %.2f\n",
      e.total_s() * 1e3, e.forward_s * 1e3, e.backward_s * 1e3,
      e.memory_s * 1e3,
      e.measured_step
          ? absl::StrFormat(", the measured step (layer rates: %.2f ms)",
                            e.estimated_s * 1e3)
          : "",
      e.roofline ? ", some layers from the roofline (not calibrated)" : "",
      c.compute.step_cv);
  const planner::PlanOptions& o = plan.request.options;
  absl::StrAppendFormat(
      &out, "placement: %s; SSP bound %d; BSP backup workers %d\n\n",
      o.placement == planner::Placement::kSharedHost
          ? absl::StrCat("every process on one host of ",
                         o.cores > 0 ? o.cores : c.cluster.cores, " cores")
          : "one host per worker and server",
      plan.request.staleness, plan.request.backup_workers);

  std::vector<std::vector<std::string>> rows = {
      {"WORKERS", "SERVERS", "MODE", "EXAMPLES/S", "STEP MS", "BOTTLENECK",
       "BUSIEST SERVER PER STEP (IN, OUT, REQUESTS, CPU)"}};
  for (size_t i = 0; i < plan.rows.size(); ++i) {
    const Prediction& p = plan.rows[i];
    rows.push_back(
        {absl::StrCat(p.job.workers), absl::StrCat(p.job.servers),
         planner::ModeName(p.job.mode), Rate(p.examples_per_s),
         absl::StrFormat("%.2f", p.step_s * 1e3),
         planner::BottleneckName(p.bottleneck),
         absl::StrFormat("#%d: %s, %s, %.0f, %.2f ms", p.busiest.index,
                         Megabytes(p.busiest.bytes_in),
                         Megabytes(p.busiest.bytes_out), p.busiest.requests,
                         p.busiest.cpu_s * 1e3) +
             (i == plan.recommended ? "  <- recommended" : "")});
  }
  out += TextTable(rows);
  out += "\nall-reduce of the same gradients (as DDP runs it, no servers):\n";
  std::vector<std::vector<std::string>> ar = {{"WORKERS", "RING EXAMPLES/S",
                                               "BOTTLENECK", "TREE EXAMPLES/S",
                                               "BOTTLENECK"}};
  for (size_t i = 0; i + 1 < plan.all_reduce.size(); i += 2) {
    const Prediction& ring = plan.all_reduce[i];
    const Prediction& tree = plan.all_reduce[i + 1];
    ar.push_back({absl::StrCat(ring.job.workers), Rate(ring.examples_per_s),
                  planner::BottleneckName(ring.bottleneck),
                  Rate(tree.examples_per_s),
                  planner::BottleneckName(tree.bottleneck)});
  }
  out += TextTable(ar);
  absl::StrAppend(&out, "\nrecommended: ", plan.reason, "\n");
  return out;
}

// Writes <png>.dat and <png>.gp beside the PNG and runs gnuplot.
absl::Status Plot(const planner::Plan& plan, const planner::ModelSpec& m,
                  const std::string& png) {
  const std::string data = png + ".dat", script = png + ".gp";
  std::ofstream(data) << planner::PlotData(plan);
  std::ofstream(script) << planner::GnuplotScript(
      plan, data, png,
      absl::StrCat("predicted throughput: ", m.name, ", batch ", m.batch));
  const std::string cmd = absl::StrCat("gnuplot '", script, "' 2>&1");
  if (std::system(cmd.c_str()) != 0) {
    return absl::InternalError(
        absl::StrCat("--plot=", png,
                     ": gnuplot failed (is it installed? Debian: "
                     "gnuplot-nox); the data is in ",
                     data, ", the script in ", script));
  }
  return absl::OkStatus();
}

}  // namespace

void TakePlanRanges(int* argc, char** argv) {
  bool plan = false;
  for (int i = 1; i < *argc; ++i)
    plan = plan || std::strcmp(argv[i], "plan") == 0;
  if (!plan) return;
  int out = 1;
  for (int i = 1; i < *argc; ++i) {
    const std::string a = argv[i];
    bool taken = false;
    for (auto [name, value] :
         {std::pair<const char*, std::string*>{"workers", &WorkerRanges()},
          {"servers", &ServerRanges()}}) {
      for (const std::string dash : {"--", "-"}) {
        const std::string flag = dash + name;
        if (a.rfind(flag + "=", 0) == 0) {
          *value = a.substr(flag.size() + 1);
          taken = true;
        } else if (a == flag && i + 1 < *argc) {
          *value = argv[++i];
          taken = true;
        }
        if (taken) break;
      }
      if (taken) break;
    }
    if (!taken) argv[out++] = argv[i];
  }
  *argc = out;
  argv[out] = nullptr;
}

int PlanCommand(bool json) {
  const std::string model_path = absl::GetFlag(FLAGS_model);
  const std::string cal_path = absl::GetFlag(FLAGS_calibration);
  if (model_path.empty()) {
    std::fprintf(stderr,
                 "psctl plan: needs --model=FILE (and --calibration=FILE from "
                 "psctl calibrate)\n");
    return kUsage;
  }
  planner::PlanRequest r;
  absl::StatusOr<std::vector<int>> workers =
      planner::ParseCounts(WorkerRanges(), "--workers");
  absl::StatusOr<std::vector<int>> servers =
      planner::ParseCounts(ServerRanges(), "--servers");
  absl::StatusOr<std::vector<planner::Mode>> modes =
      planner::ParseModes(absl::GetFlag(FLAGS_modes), "--modes");
  for (const absl::Status& s :
       {workers.status(), servers.status(), modes.status()}) {
    if (!s.ok()) {
      std::fprintf(stderr, "psctl plan: %s\n",
                   std::string(s.message()).c_str());
      return kUsage;
    }
  }
  r.workers = *workers;
  r.servers = *servers;
  r.modes = *modes;
  r.backup_workers = absl::GetFlag(FLAGS_backup_workers);
  r.staleness = Changed("staleness")
                    ? static_cast<int>(absl::GetFlag(FLAGS_staleness))
                    : kPlanDefaultStaleness;
  const std::string placement = absl::GetFlag(FLAGS_placement);
  if (placement == "shared") {
    r.options.placement = planner::Placement::kSharedHost;
  } else if (placement == "dedicated") {
    r.options.placement = planner::Placement::kDedicatedHosts;
  } else {
    std::fprintf(stderr, "psctl plan: --placement=%s: shared or dedicated\n",
                 placement.c_str());
    return kUsage;
  }
  r.options.cores = absl::GetFlag(FLAGS_cores);
  r.options.nic_gbs = absl::GetFlag(FLAGS_nic_gbps);
  if (r.backup_workers < 0 || r.staleness < 0 || r.options.cores < 0 ||
      r.options.nic_gbs < 0) {
    std::fprintf(stderr,
                 "psctl plan: --backup_workers, --staleness, --cores and "
                 "--nic_gbps must be >= 0\n");
    return kUsage;
  }

  absl::StatusOr<planner::ModelSpec> model = planner::ReadModelSpec(model_path);
  if (!model.ok()) return Fail(model.status());
  absl::StatusOr<planner::Calibration> cal = planner::ReadCalibration(cal_path);
  if (!cal.ok()) return Fail(cal.status());
  // A calibration from elsewhere predicts someone else's cluster.
  const std::string scheduler =
      Changed("scheduler") ? absl::GetFlag(FLAGS_scheduler) : "";
  if (absl::Status s = planner::CheckCluster(
          *cal, planner::ThisHost(), scheduler,
          absl::StrCat("calibration file '", cal_path, "'"));
      !s.ok()) {
    if (!absl::GetFlag(FLAGS_allow_other_cluster)) return Fail(s);
    std::fprintf(stderr, "psctl plan: warning (--allow_other_cluster): %s\n",
                 std::string(s.message()).c_str());
  }

  const planner::Plan plan = planner::MakePlan(*model, *cal, r);
  if (json) {
    std::printf("%s\n",
                planner::PlanToJson(plan, *model, *cal).Dump(2).c_str());
  } else {
    std::printf("%s", HumanPlan(plan, *model, *cal, cal_path).c_str());
  }
  const std::string png = absl::GetFlag(FLAGS_plot);
  if (!png.empty()) {
    if (absl::Status s = Plot(plan, *model, png); !s.ok()) return Fail(s);
    if (!json) std::printf("plot: %s\n", png.c_str());
  }
  return 0;
}

}  // namespace downpour
