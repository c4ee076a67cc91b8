#include "planner/plan.h"

#include <algorithm>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace downpour {
namespace planner {

namespace {

std::string ShortRate(double v) {
  if (v >= 1e6) return absl::StrFormat("%.2fM", v / 1e6);
  if (v >= 1e3) return absl::StrFormat("%.1fk", v / 1e3);
  return absl::StrFormat("%.0f", v);
}

std::string Describe(const Prediction& p) {
  return absl::StrCat(p.job.workers, " worker", p.job.workers == 1 ? "" : "s",
                      ", ", p.job.servers, " server",
                      p.job.servers == 1 ? "" : "s", ", ",
                      ModeName(p.job.mode));
}

}  // namespace

Plan MakePlan(const ModelSpec& spec, const Calibration& c,
              const PlanRequest& request) {
  Plan plan;
  plan.request = request;
  for (int w : request.workers) {
    for (int s : request.servers) {
      for (Mode m : request.modes) {
        JobShape job;
        job.workers = w;
        job.servers = s;
        job.mode = m;
        job.backup_workers = m == Mode::kBsp ? request.backup_workers : 0;
        job.staleness = request.staleness;
        plan.rows.push_back(Predict(spec, c, job, request.options));
      }
    }
    for (AllReduce a : {AllReduce::kRing, AllReduce::kTree}) {
      plan.all_reduce.push_back(
          PredictAllReduce(spec, c, w, a, request.options));
    }
  }
  double best = 0;
  for (const Prediction& p : plan.rows) best = std::max(best, p.examples_per_s);
  // Among the rows within the tolerance of the fastest: the fewest
  // processes, then the earliest mode in BSP, SSP, ASP order.
  bool found = false;
  for (size_t i = 0; i < plan.rows.size(); ++i) {
    const Prediction& p = plan.rows[i];
    if (p.examples_per_s < (1 - kRecommendTolerance) * best) continue;
    const Prediction& r = plan.rows[plan.recommended];
    const int procs = p.job.workers + p.job.backup_workers + p.job.servers;
    const int r_procs = r.job.workers + r.job.backup_workers + r.job.servers;
    if (!found || procs < r_procs ||
        (procs == r_procs && p.job.mode < r.job.mode)) {
      plan.recommended = i;
      found = true;
    }
  }
  const Prediction& r = plan.rows[plan.recommended];
  plan.reason = absl::StrCat(
      Describe(r), ": ", ShortRate(r.examples_per_s),
      " examples/s predicted (bottleneck: ", BottleneckName(r.bottleneck), ")");
  if (r.examples_per_s < best) {
    absl::StrAppend(&plan.reason, "; within ",
                    absl::StrFormat("%.0f", kRecommendTolerance * 100),
                    "% of the fastest (", ShortRate(best),
                    ") with fewer processes");
  }
  // All-reduce at the same worker count, for comparison.
  for (size_t i = 0; i < plan.all_reduce.size(); i += 2) {
    const Prediction& ring = plan.all_reduce[i];
    if (ring.job.workers != r.job.workers) continue;
    absl::StrAppend(&plan.reason, "; ring all-reduce with ", r.job.workers,
                    " workers: ", ShortRate(ring.examples_per_s),
                    " examples/s");
  }
  return plan;
}

namespace {

Json PredictionToJson(const Prediction& p) {
  Json j = Json::Object();
  j.Set("workers", Json::Number(p.job.workers));
  if (p.job.servers > 0) {
    j.Set("backup_workers", Json::Number(p.job.backup_workers));
    j.Set("servers", Json::Number(p.job.servers));
    j.Set("mode", Json::String(ModeName(p.job.mode)));
    if (p.job.mode == Mode::kSsp) {
      j.Set("staleness", Json::Number(p.job.staleness));
    }
  }
  j.Set("examples_per_s", Json::Number(p.examples_per_s));
  j.Set("step_ms", Json::Number(p.step_s * 1e3));
  j.Set("bottleneck", Json::String(BottleneckName(p.bottleneck)));
  Json terms = Json::Object();
  terms.Set("compute_ms", Json::Number(p.compute.total_s() * 1e3));
  terms.Set("straggler_factor", Json::Number(p.straggler_factor));
  terms.Set("exposed_comm_ms", Json::Number(p.exposed_comm_s * 1e3));
  terms.Set("critical_ms", Json::Number(p.critical_s * 1e3));
  terms.Set("server_wait_ms", Json::Number(p.server_wait_s * 1e3));
  terms.Set("client_cpu_ms", Json::Number(p.client_cpu_s * 1e3));
  terms.Set("caller_cpu_ms", Json::Number(p.caller_cpu_s * 1e3));
  terms.Set("server_ms", Json::Number(p.server_s * 1e3));
  terms.Set("servers_cpu_ms", Json::Number(p.servers_cpu_s * 1e3));
  terms.Set("nic_ms", Json::Number(p.nic_s * 1e3));
  terms.Set("host_ms", Json::Number(p.host_s * 1e3));
  terms.Set("effective_cores", Json::Number(p.effective_cores));
  j.Set("terms", std::move(terms));
  if (p.job.servers > 0) {
    Json s = Json::Object();
    s.Set("index", Json::Number(p.busiest.index));
    s.Set("requests_per_step", Json::Number(p.busiest.requests));
    s.Set("bytes_in_per_step", Json::Number(p.busiest.bytes_in));
    s.Set("bytes_out_per_step", Json::Number(p.busiest.bytes_out));
    s.Set("cpu_ms_per_step", Json::Number(p.busiest.cpu_s * 1e3));
    j.Set("busiest_server", std::move(s));
  }
  return j;
}

}  // namespace

Json PlanToJson(const Plan& plan, const ModelSpec& spec, const Calibration& c) {
  Json j = Json::Object();
  Json model = ModelSpecToJson(spec);
  model.Set("dense_parameters",
            Json::Number(static_cast<double>(spec.DenseFloats())));
  j.Set("model", std::move(model));
  Json cal = Json::Object();
  cal.Set("host", Json::String(c.cluster.host));
  cal.Set("cores", Json::Number(static_cast<double>(c.cluster.cores)));
  cal.Set("scheduler", Json::String(c.cluster.scheduler));
  cal.Set("created", Json::String(c.created));
  j.Set("calibration", std::move(cal));
  const ComputeEstimate e = WorkerCompute(spec, c.compute);
  Json compute = Json::Object();
  compute.Set("forward_ms", Json::Number(e.forward_s * 1e3));
  compute.Set("backward_ms", Json::Number(e.backward_s * 1e3));
  compute.Set("memory_ms", Json::Number(e.memory_s * 1e3));
  compute.Set("roofline", Json::Bool(e.roofline));
  compute.Set("measured_step", Json::Bool(e.measured_step));
  compute.Set("layer_estimate_ms", Json::Number(e.estimated_s * 1e3));
  j.Set("worker_compute", std::move(compute));
  j.Set("placement",
        Json::String(plan.request.options.placement == Placement::kSharedHost
                         ? "shared_host"
                         : "dedicated_hosts"));
  Json rows = Json::Array();
  for (const Prediction& p : plan.rows) rows.Append(PredictionToJson(p));
  j.Set("configurations", std::move(rows));
  Json ar = Json::Array();
  for (size_t i = 0; i < plan.all_reduce.size(); ++i) {
    Json a = PredictionToJson(plan.all_reduce[i]);
    a.Set("algorithm", Json::String(i % 2 == 0 ? "ring" : "tree"));
    ar.Append(std::move(a));
  }
  j.Set("all_reduce", std::move(ar));
  Json rec = PredictionToJson(plan.rows[plan.recommended]);
  rec.Set("reason", Json::String(plan.reason));
  j.Set("recommended", std::move(rec));
  return j;
}

std::string PlotData(const Plan& plan) {
  std::string out;
  const PlanRequest& r = plan.request;
  for (Mode m : r.modes) {
    for (int s : r.servers) {
      absl::StrAppend(&out, "# ", ModeName(m), ", ", s, " servers\n");
      for (const Prediction& p : plan.rows) {
        if (p.job.mode != m || p.job.servers != s) continue;
        absl::StrAppendFormat(&out, "%d %.1f\n", p.job.workers,
                              p.examples_per_s);
      }
      out += "\n\n";
    }
  }
  // The last block: ring all-reduce.
  absl::StrAppend(&out, "# ring all-reduce\n");
  for (size_t i = 0; i < plan.all_reduce.size(); i += 2) {
    absl::StrAppendFormat(&out, "%d %.1f\n", plan.all_reduce[i].job.workers,
                          plan.all_reduce[i].examples_per_s);
  }
  return out;
}

std::string GnuplotScript(const Plan& plan, const std::string& data_path,
                          const std::string& png, const std::string& title) {
  const PlanRequest& r = plan.request;
  const int panels = static_cast<int>(r.modes.size());
  std::string gp = absl::StrCat(
      "set terminal pngcairo size ", 480 * panels + 120, ",460\n",
      "set output '", png, "'\n", "set multiplot layout 1,", panels, " title '",
      title, "'\n", "set xlabel 'workers'\nset ylabel 'predicted examples/s'\n",
      "set key top left\nset grid\nset yrange [0:*]\n");
  if (r.workers.size() <= 16) {
    std::string tics;
    for (int w : r.workers) absl::StrAppend(&tics, tics.empty() ? "" : ", ", w);
    absl::StrAppend(&gp, "set xtics (", tics, ")\n");
  }
  const int ring_index = static_cast<int>(r.modes.size() * r.servers.size());
  for (size_t mi = 0; mi < r.modes.size(); ++mi) {
    absl::StrAppend(&gp, "set title '", ModeName(r.modes[mi]), "'\nplot ");
    for (size_t si = 0; si < r.servers.size(); ++si) {
      absl::StrAppend(&gp, "'", data_path, "' index ",
                      mi * r.servers.size() + si,
                      " using 1:2 with linespoints lw 2 title '", r.servers[si],
                      " server", r.servers[si] == 1 ? "" : "s", "', ");
    }
    absl::StrAppend(&gp, "'", data_path, "' index ", ring_index,
                    " using 1:2 with lines dt 2 lc rgb 'gray40' title "
                    "'ring all-reduce'\n");
  }
  gp += "unset multiplot\n";
  return gp;
}

absl::StatusOr<std::vector<int>> ParseCounts(absl::string_view text,
                                             absl::string_view flag) {
  std::vector<int> out;
  auto bad = [&](absl::string_view why) {
    return absl::InvalidArgumentError(absl::StrCat(
        flag, "=", text, ": ", why,
        " (a count, a range A..B or a list, e.g. 4, 1..8, 1,2,4)"));
  };
  if (absl::StripAsciiWhitespace(text).empty()) return bad("empty");
  for (absl::string_view item : absl::StrSplit(text, ',')) {
    item = absl::StripAsciiWhitespace(item);
    int lo, hi;
    const size_t dots = item.find("..");
    if (dots != absl::string_view::npos) {
      if (!absl::SimpleAtoi(item.substr(0, dots), &lo) ||
          !absl::SimpleAtoi(item.substr(dots + 2), &hi)) {
        return bad(absl::StrCat("'", item, "' is not a range"));
      }
    } else {
      if (!absl::SimpleAtoi(item, &lo)) {
        return bad(absl::StrCat("'", item, "' is not a number"));
      }
      hi = lo;
    }
    if (lo < 1 || hi > 4096 || lo > hi) {
      return bad(absl::StrCat("'", item, "' is outside 1..4096 or empty"));
    }
    for (int v = lo; v <= hi; ++v) {
      if (std::find(out.begin(), out.end(), v) == out.end()) out.push_back(v);
    }
  }
  std::sort(out.begin(), out.end());
  return out;
}

absl::StatusOr<std::vector<Mode>> ParseModes(absl::string_view text,
                                             absl::string_view flag) {
  std::vector<Mode> out;
  for (absl::string_view item : absl::StrSplit(text, ',')) {
    item = absl::StripAsciiWhitespace(item);
    bool known = false;
    for (Mode m : kAllModes) {
      if (item == ModeName(m)) {
        known = true;
        if (std::find(out.begin(), out.end(), m) == out.end()) out.push_back(m);
      }
    }
    if (!known) {
      return absl::InvalidArgumentError(absl::StrCat(
          flag, "=", text, ": '", item, "' is not bsp, ssp or asp"));
    }
  }
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace planner
}  // namespace downpour
