#include "planner/calibration.h"

#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "common/status_macros.h"
#include "planner/model_spec.h"
#include "planner/object_reader.h"

namespace downpour {
namespace planner {

Spread SpreadOf(std::vector<double> samples) {
  Spread s;
  if (samples.empty()) return s;
  std::sort(samples.begin(), samples.end());
  // Nearest rank on (n - 1), so that 3 samples give min, median, max.
  auto at = [&](double q) {
    const double pos = q * (samples.size() - 1);
    const size_t lo = static_cast<size_t>(pos);
    const size_t hi = std::min(lo + 1, samples.size() - 1);
    return samples[lo] + (samples[hi] - samples[lo]) * (pos - lo);
  };
  s.median = at(0.5);
  s.p10 = at(0.1);
  s.p90 = at(0.9);
  s.samples = static_cast<int64_t>(samples.size());
  return s;
}

ClusterIdentity ThisHost() {
  ClusterIdentity id;
  char name[256] = {0};
  if (gethostname(name, sizeof(name) - 1) == 0) id.host = name;
  std::ifstream cpuinfo("/proc/cpuinfo");
  std::string line;
  while (std::getline(cpuinfo, line)) {
    if (line.rfind("model name", 0) == 0) {
      const size_t colon = line.find(':');
      if (colon != std::string::npos) {
        id.cpu_model = std::string(absl::StripAsciiWhitespace(
            absl::string_view(line).substr(colon + 1)));
      }
      break;
    }
  }
  if (id.cpu_model.empty()) id.cpu_model = "unknown";
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) == 0) {
    id.cores = CPU_COUNT(&set);
  } else {
    id.cores = std::max<long>(1, sysconf(_SC_NPROCESSORS_ONLN));
  }
  return id;
}

double ComputeCalibration::EffectiveCores(double threads) const {
  if (effective_cores.empty()) return threads;
  // (0, 0) is implied below the first measured count.
  double prev_t = 0, prev_c = 0;
  for (const auto& [t, c] : effective_cores) {
    if (threads <= t) {
      return prev_c + (c - prev_c) * (threads - prev_t) / (t - prev_t);
    }
    prev_t = static_cast<double>(t);
    prev_c = c;
  }
  return prev_c;
}

const LayerRate* ComputeCalibration::FindLayer(int64_t batch, int64_t in,
                                               int64_t out) const {
  for (const LayerRate& l : layers) {
    if (l.batch == batch && l.in == in && l.out == out) return &l;
  }
  return nullptr;
}

const StepTime* ComputeCalibration::FindStep(
    int64_t batch, const std::vector<int64_t>& layer_sizes) const {
  for (const StepTime& t : steps) {
    if (t.batch == batch && t.layer_sizes == layer_sizes) return &t;
  }
  return nullptr;
}

namespace {

Json SpreadToJson(const Spread& s) {
  Json j = Json::Object();
  j.Set("median", Json::Number(s.median));
  j.Set("p10", Json::Number(s.p10));
  j.Set("p90", Json::Number(s.p90));
  j.Set("samples", Json::Number(static_cast<double>(s.samples)));
  return j;
}

// A required Spread member of `r`'s object; figures are >= 0.
Spread ReadSpread(ObjectReader& r, const std::string& where,
                  absl::string_view field) {
  Spread s;
  const Json* v = r.Value(field);
  if (v == nullptr) return s;
  ObjectReader sr(*v, where, r.Path(field));
  s.median = sr.Number("median", 0);
  s.p10 = sr.Number("p10", 0);
  s.p90 = sr.Number("p90", 0);
  s.samples = sr.OptionalInt("samples", 1, 0);
  if (sr.status().ok() && !(s.p10 <= s.median && s.median <= s.p90)) {
    sr.Fail("median", v->Find("median"),
            "must lie between p10 and p90 (a figure edited by hand?)");
  }
  r.Merge(sr.Finish());
  return s;
}

// A required Spread whose median must be > 0 (a rate the model divides
// by).
Spread ReadPositive(ObjectReader& r, const std::string& where,
                    absl::string_view field) {
  Spread s = ReadSpread(r, where, field);
  if (r.status().ok() && s.median <= 0) {
    const Json* v = r.OptionalValue(field);
    r.Merge(FieldError(where, absl::StrCat(r.Path(field), ".median"),
                       v != nullptr ? v->Find("median") : nullptr,
                       "must be > 0"));
  }
  return s;
}

}  // namespace

Json CalibrationToJson(const Calibration& c) {
  Json j = Json::Object();
  j.Set("format_version", Json::Number(static_cast<double>(c.format_version)));
  j.Set("created", Json::String(c.created));
  Json cluster = Json::Object();
  cluster.Set("host", Json::String(c.cluster.host));
  cluster.Set("cpu_model", Json::String(c.cluster.cpu_model));
  cluster.Set("cores", Json::Number(static_cast<double>(c.cluster.cores)));
  cluster.Set("scheduler", Json::String(c.cluster.scheduler));
  j.Set("cluster", std::move(cluster));

  const ComputeCalibration& k = c.compute;
  Json compute = Json::Object();
  compute.Set("gemm_peak_gflops", SpreadToJson(k.gemm_peak_gflops));
  compute.Set("memory_gbs", SpreadToJson(k.memory_gbs));
  Json cores = Json::Array();
  for (const auto& [threads, c] : k.effective_cores) {
    Json e = Json::Object();
    e.Set("threads", Json::Number(static_cast<double>(threads)));
    e.Set("cores", Json::Number(c));
    cores.Append(std::move(e));
  }
  compute.Set("effective_cores", std::move(cores));
  compute.Set("step_cv", Json::Number(k.step_cv));
  Json layers = Json::Array();
  for (const LayerRate& l : k.layers) {
    Json e = Json::Object();
    e.Set("batch", Json::Number(static_cast<double>(l.batch)));
    e.Set("in", Json::Number(static_cast<double>(l.in)));
    e.Set("out", Json::Number(static_cast<double>(l.out)));
    e.Set("fwd_gflops", SpreadToJson(l.fwd_gflops));
    e.Set("wgrad_gflops", SpreadToJson(l.wgrad_gflops));
    e.Set("dgrad_gflops", SpreadToJson(l.dgrad_gflops));
    layers.Append(std::move(e));
  }
  compute.Set("layers", std::move(layers));
  Json steps = Json::Array();
  for (const StepTime& t : k.steps) {
    Json e = Json::Object();
    e.Set("batch", Json::Number(static_cast<double>(t.batch)));
    Json sizes = Json::Array();
    for (int64_t v : t.layer_sizes) sizes.Append(Json::Number(v));
    e.Set("dense_layers", std::move(sizes));
    e.Set("ms", SpreadToJson(t.ms));
    if (t.streamed_ms.samples > 0) {
      e.Set("streamed_ms", SpreadToJson(t.streamed_ms));
    }
    if (t.streamed_cpu_ms > 0) {
      e.Set("streamed_cpu_ms", Json::Number(t.streamed_cpu_ms));
    }
    if (t.streamed_server_cpu_ms > 0) {
      e.Set("streamed_server_cpu_ms", Json::Number(t.streamed_server_cpu_ms));
    }
    steps.Append(std::move(e));
  }
  compute.Set("steps", std::move(steps));
  j.Set("compute", std::move(compute));

  const NetworkCalibration& n = c.network;
  Json net = Json::Object();
  net.Set("latency_us", SpreadToJson(n.latency_us));
  net.Set("message_bytes", Json::Number(static_cast<double>(n.message_bytes)));
  net.Set("in_flight", Json::Number(static_cast<double>(n.in_flight)));
  net.Set("push_gbs_1", SpreadToJson(n.push_gbs_1));
  net.Set("pull_gbs_1", SpreadToJson(n.pull_gbs_1));
  net.Set("push_gbs_k", SpreadToJson(n.push_gbs_k));
  net.Set("pull_gbs_k", SpreadToJson(n.pull_gbs_k));
  net.Set("small_pulls_per_s_k", Json::Number(n.small_pulls_per_s_k));
  net.Set("client_us_per_request", Json::Number(n.client_us_per_request));
  net.Set("client_ns_per_push_byte", Json::Number(n.client_ns_per_push_byte));
  net.Set("client_ns_per_pull_byte", Json::Number(n.client_ns_per_pull_byte));
  net.Set("server_us_per_request", Json::Number(n.server_us_per_request));
  net.Set("server_ns_per_push_byte", Json::Number(n.server_ns_per_push_byte));
  net.Set("server_ns_per_pull_byte", Json::Number(n.server_ns_per_pull_byte));
  net.Set("server_us_per_held_request",
          Json::Number(n.server_us_per_held_request));
  net.Set("server_serial_fraction", Json::Number(n.server_serial_fraction));
  net.Set("caller_us_per_request", Json::Number(n.caller_us_per_request));
  net.Set("caller_ns_per_byte", Json::Number(n.caller_ns_per_byte));
  net.Set("server_cpu_source", Json::String(n.server_cpu_source));
  net.Set("control_client_us", Json::Number(n.control_client_us));
  net.Set("control_scheduler_us", Json::Number(n.control_scheduler_us));
  net.Set("control_latency_us", Json::Number(n.control_latency_us));
  j.Set("network", std::move(net));

  Json apply = Json::Object();
  for (const auto& [name, s] : c.apply_ns_per_float) {
    apply.Set(name, SpreadToJson(s));
  }
  j.Set("apply_ns_per_float", std::move(apply));
  return j;
}

absl::StatusOr<Calibration> ParseCalibration(absl::string_view text,
                                             const std::string& where) {
  DP_ASSIGN_OR_RETURN(const Json doc, ParseJson(text), where);
  Calibration c;
  ObjectReader r(doc, where);
  c.format_version = r.Int("format_version", 1);
  if (r.status().ok() && c.format_version != kCalibrationFormat) {
    return absl::FailedPreconditionError(
        absl::StrCat(where, ": field 'format_version' is ", c.format_version,
                     ", this psctl reads ", kCalibrationFormat,
                     " (calibrate again with this psctl)"));
  }
  c.created = r.OptionalString("created", "");

  if (const Json* v = r.Value("cluster")) {
    ObjectReader cr(*v, where, r.Path("cluster"));
    c.cluster.host = cr.String("host");
    c.cluster.cpu_model = cr.String("cpu_model");
    c.cluster.cores = cr.Int("cores", 1, 1 << 20);
    c.cluster.scheduler = cr.String("scheduler");
    r.Merge(cr.Finish());
  }

  if (const Json* v = r.Value("compute")) {
    ObjectReader kr(*v, where, r.Path("compute"));
    ComputeCalibration& k = c.compute;
    k.gemm_peak_gflops = ReadPositive(kr, where, "gemm_peak_gflops");
    k.memory_gbs = ReadPositive(kr, where, "memory_gbs");
    k.step_cv = kr.OptionalNumber("step_cv", 0, 0, 10);
    if (const Json* sp = kr.Value("effective_cores")) {
      if (!sp->is_array()) {
        kr.Fail("effective_cores", sp, "must be an array");
      } else {
        int64_t last = 0;
        for (size_t i = 0; i < sp->items().size(); ++i) {
          ObjectReader er(sp->items()[i], where, kr.Item("effective_cores", i));
          const int64_t t = er.Int("threads", 1, 1 << 20);
          const double s = er.Number("cores", 0.01, 1 << 20);
          if (er.status().ok() && t <= last) {
            er.Fail("threads", sp->items()[i].Find("threads"),
                    "thread counts must increase");
          }
          last = t;
          kr.Merge(er.Finish());
          k.effective_cores.emplace_back(t, s);
        }
      }
    }
    if (const Json* ls = kr.OptionalValue("layers")) {
      if (!ls->is_array()) {
        kr.Fail("layers", ls, "must be an array");
      } else {
        for (size_t i = 0; i < ls->items().size(); ++i) {
          ObjectReader lr(ls->items()[i], where, kr.Item("layers", i));
          LayerRate l;
          l.batch = lr.Int("batch", 1);
          l.in = lr.Int("in", 1);
          l.out = lr.Int("out", 1);
          l.fwd_gflops = ReadPositive(lr, where, "fwd_gflops");
          l.wgrad_gflops = ReadPositive(lr, where, "wgrad_gflops");
          l.dgrad_gflops = ReadPositive(lr, where, "dgrad_gflops");
          kr.Merge(lr.Finish());
          k.layers.push_back(l);
        }
      }
    }
    if (const Json* st = kr.OptionalValue("steps")) {
      if (!st->is_array()) {
        kr.Fail("steps", st, "must be an array");
      } else {
        for (size_t i = 0; i < st->items().size(); ++i) {
          ObjectReader sr(st->items()[i], where, kr.Item("steps", i));
          StepTime t;
          t.batch = sr.Int("batch", 1);
          if (const Json* sizes = sr.Value("dense_layers")) {
            bool ok = sizes->is_array() && sizes->items().size() >= 2;
            for (const Json& v : sizes->items()) {
              ok = ok && v.is_number() && v.number() >= 1;
              if (ok) t.layer_sizes.push_back(static_cast<int64_t>(v.number()));
            }
            if (!ok) {
              sr.Fail("dense_layers", sizes,
                      "must be at least two layer sizes >= 1");
            }
          }
          t.ms = ReadPositive(sr, where, "ms");
          if (sr.OptionalValue("streamed_ms") != nullptr) {
            t.streamed_ms = ReadPositive(sr, where, "streamed_ms");
          }
          t.streamed_cpu_ms = sr.OptionalNumber("streamed_cpu_ms", 0, 0);
          t.streamed_server_cpu_ms =
              sr.OptionalNumber("streamed_server_cpu_ms", 0, 0);
          kr.Merge(sr.Finish());
          k.steps.push_back(t);
        }
      }
    }
    r.Merge(kr.Finish());
  }

  if (const Json* v = r.Value("network")) {
    ObjectReader nr(*v, where, r.Path("network"));
    NetworkCalibration& n = c.network;
    n.latency_us = ReadPositive(nr, where, "latency_us");
    n.message_bytes = nr.Int("message_bytes", 1);
    n.in_flight = nr.Int("in_flight", 1, 1 << 16);
    n.push_gbs_1 = ReadPositive(nr, where, "push_gbs_1");
    n.pull_gbs_1 = ReadPositive(nr, where, "pull_gbs_1");
    n.push_gbs_k = ReadPositive(nr, where, "push_gbs_k");
    n.pull_gbs_k = ReadPositive(nr, where, "pull_gbs_k");
    n.small_pulls_per_s_k = nr.OptionalNumber("small_pulls_per_s_k", 0, 0);
    n.client_us_per_request = nr.Number("client_us_per_request", 0);
    n.client_ns_per_push_byte = nr.Number("client_ns_per_push_byte", 0);
    n.client_ns_per_pull_byte = nr.Number("client_ns_per_pull_byte", 0);
    n.server_us_per_request = nr.Number("server_us_per_request", 0);
    n.server_ns_per_push_byte = nr.Number("server_ns_per_push_byte", 0);
    n.server_ns_per_pull_byte = nr.Number("server_ns_per_pull_byte", 0);
    n.server_us_per_held_request = nr.Number("server_us_per_held_request", 0);
    // Calibrations written before it was measured: all of it serial.
    n.server_serial_fraction =
        nr.OptionalNumber("server_serial_fraction", 1, 0, 1);
    n.caller_us_per_request = nr.Number("caller_us_per_request", 0);
    n.caller_ns_per_byte = nr.Number("caller_ns_per_byte", 0);
    n.server_cpu_source = nr.OptionalString("server_cpu_source", "measured");
    n.control_client_us = nr.Number("control_client_us", 0);
    n.control_scheduler_us = nr.Number("control_scheduler_us", 0);
    n.control_latency_us = nr.Number("control_latency_us", 0);
    r.Merge(nr.Finish());
  }

  if (const Json* v = r.Value("apply_ns_per_float")) {
    if (!v->is_object()) {
      r.Fail("apply_ns_per_float", v, "must be an object of handler figures");
    } else {
      ObjectReader ar(*v, where, r.Path("apply_ns_per_float"));
      for (const auto& [name, unused] : v->members()) {
        c.apply_ns_per_float[name] = ReadSpread(ar, where, name);
      }
      r.Merge(ar.Finish());
    }
  }
  DP_RETURN_IF_ERROR(r.Finish());
  return c;
}

absl::StatusOr<Calibration> ReadCalibration(const std::string& path) {
  DP_ASSIGN_OR_RETURN(const std::string text,
                      ReadTextFile(path, "calibration file"));
  return ParseCalibration(text, absl::StrCat("calibration file '", path, "'"));
}

absl::Status WriteCalibration(const std::string& path, const Calibration& c) {
  const std::string tmp = absl::StrCat(path, ".tmp.", getpid());
  {
    std::ofstream out(tmp);
    out << CalibrationToJson(c).Dump(2) << "\n";
    out.close();
    if (!out) {
      std::remove(tmp.c_str());
      return absl::InternalError(
          absl::StrCat("calibration file '", path, "': cannot write ", tmp));
    }
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    std::remove(tmp.c_str());
    return absl::InternalError(
        absl::StrCat("calibration file '", path, "': cannot rename ", tmp));
  }
  return absl::OkStatus();
}

absl::Status CheckCluster(const Calibration& c, const ClusterIdentity& here,
                          const std::string& scheduler,
                          const std::string& where) {
  auto differs = [&](absl::string_view field, const std::string& theirs,
                     const std::string& ours, absl::string_view whose) {
    return absl::FailedPreconditionError(absl::StrCat(
        where, ": field 'cluster.", field, "' is '", theirs, "', ", whose,
        " is '", ours,
        "': it was measured on another cluster (run psctl calibrate there, "
        "or pass --allow_other_cluster to plan with it anyway)"));
  };
  if (!scheduler.empty()) {
    if (c.cluster.scheduler != scheduler) {
      return differs("scheduler", c.cluster.scheduler, scheduler,
                     "the cluster planned for (--scheduler)");
    }
    return absl::OkStatus();
  }
  if (c.cluster.host != here.host) {
    return differs("host", c.cluster.host, here.host, "this host");
  }
  if (c.cluster.cpu_model != here.cpu_model) {
    return differs("cpu_model", c.cluster.cpu_model, here.cpu_model,
                   "this host's");
  }
  if (c.cluster.cores != here.cores) {
    return differs("cores", absl::StrCat(c.cluster.cores),
                   absl::StrCat(here.cores), "this host's");
  }
  return absl::OkStatus();
}

}  // namespace planner
}  // namespace downpour
