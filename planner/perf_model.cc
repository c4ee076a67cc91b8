#include "planner/perf_model.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "planner/order_stats.h"
#include "planner/traffic.h"

namespace downpour {
namespace planner {

const char* BottleneckName(Bottleneck b) {
  switch (b) {
    case Bottleneck::kCompute:
      return "compute";
    case Bottleneck::kLatency:
      return "latency";
    case Bottleneck::kServerCpu:
      return "server CPU";
    case Bottleneck::kServerNic:
      return "NIC";
    case Bottleneck::kHostCores:
      return "host cores";
  }
  return "?";
}

const char* AllReduceName(AllReduce a) {
  return a == AllReduce::kRing ? "ring" : "tree";
}

namespace {

// Element-wise passes over a layer's activations per step (bias, ReLU, the
// copy kept for the backward pass, the ReLU mask, softmax at the end):
// reads and writes of batch x out floats, in bytes per float.
constexpr double kActivationBytesPerFloat = 6 * 4;

// What a core gives when it is ours (calibration.h, Spread): a rate's 90th
// percentile, a cost's 10th.
double Rate(const Spread& s) { return s.p90; }
double Cost(const Spread& s) { return s.p10; }

// Rate (FLOP/s) of a product with `flops` over operands of m x k, k x n and
// a result of m x n floats, from the roofline.
double RooflineRate(double flops, double m, double n, double k,
                    const ComputeCalibration& c) {
  const double bytes = 4 * (m * k + k * n + m * n);
  const double peak = Rate(c.gemm_peak_gflops) * 1e9;
  const double memory = Rate(c.memory_gbs) * 1e9 * flops / bytes;
  return std::max(1.0, std::min(peak, memory));
}

// The cost constants of a calibration, in seconds.
struct Costs {
  double alpha;                        // round trip of a small request
  double push_bps, pull_bps;           // one in flight, bytes/s
  double push_bps_k, pull_bps_k;       // k in flight
  double cli_req, cli_push, cli_pull;  // client CPU per request, per byte
  double caller_req, caller_byte;      // the calling thread's share
  double control_cli, control_sched;   // a clock report's CPU
  double srv_req, srv_push, srv_pull;  // server CPU per request, per byte
  double srv_held;    // a byte of a BSP request held, beyond that
  double srv_serial;  // of srv_req and srv_*, the share on the data thread
  double apply_sum;   // per float
};

Costs CostsOf(const Calibration& c) {
  const NetworkCalibration& n = c.network;
  Costs k;
  k.alpha = Cost(n.latency_us) * 1e-6;
  k.push_bps = Rate(n.push_gbs_1) * 1e9;
  k.pull_bps = Rate(n.pull_gbs_1) * 1e9;
  k.push_bps_k = Rate(n.push_gbs_k) * 1e9;
  k.pull_bps_k = Rate(n.pull_gbs_k) * 1e9;
  k.cli_req = n.client_us_per_request * 1e-6;
  k.cli_push = n.client_ns_per_push_byte * 1e-9;
  k.cli_pull = n.client_ns_per_pull_byte * 1e-9;
  k.caller_req = n.caller_us_per_request * 1e-6;
  k.caller_byte = n.caller_ns_per_byte * 1e-9;
  k.control_cli = n.control_client_us * 1e-6;
  k.control_sched = n.control_scheduler_us * 1e-6;
  k.srv_req = n.server_us_per_request * 1e-6;
  k.srv_push = n.server_ns_per_push_byte * 1e-9;
  k.srv_pull = n.server_ns_per_pull_byte * 1e-9;
  // The probe holds requests of message_bytes; what holding costs grows
  // with the bytes held (calibrated at 32, 128 and 512 KiB on the 2-core
  // VM: 0, 28 and 159 us), so a request of the job is charged by its size.
  k.srv_held = n.message_bytes > 0 ? n.server_us_per_held_request * 1e-6 /
                                         static_cast<double>(n.message_bytes)
                                   : 0;
  k.srv_serial = std::clamp(n.server_serial_fraction, 0.0, 1.0);
  auto sum = c.apply_ns_per_float.find("sum");
  k.apply_sum =
      sum != c.apply_ns_per_float.end() ? Cost(sum->second) * 1e-9 : 0;
  return k;
}

// A handler's apply cost per float; an uncalibrated handler costs what sgd
// does (every handler reads and writes the row once; state is extra).
double ApplyCost(const Calibration& c, const std::string& handler) {
  auto it = c.apply_ns_per_float.find(handler);
  if (it == c.apply_ns_per_float.end()) it = c.apply_ns_per_float.find("sgd");
  return it != c.apply_ns_per_float.end() ? Cost(it->second) * 1e-9 : 0;
}

// The cores the shared host gives `threads` busy threads of the job.
double EffectiveCores(const Calibration& c, const PlanOptions& o,
                      double threads) {
  const int calibrated =
      static_cast<int>(std::max<int64_t>(1, c.cluster.cores));
  const int cores = o.cores > 0 ? o.cores : calibrated;
  const double busy = std::min<double>(threads, cores);
  // The calibrated host as measured, other users' load included; another
  // core count (planning a bigger host) is taken at face value.
  return cores == calibrated ? std::min(busy, c.compute.EffectiveCores(threads))
                             : busy;
}

ModelSpec DenseOnly(const ModelSpec& spec) {
  ModelSpec m = spec;
  m.embeddings.clear();
  return m;
}

ModelSpec EmbeddingsOnly(const ModelSpec& spec) {
  ModelSpec m = spec;
  m.layer_sizes.clear();
  return m;
}

// BSP's data-plane CPU as calibrated whole: the streamed step (psctl
// calibrate's ProbeStreamedStep, ps_worker's BSP loop against one server)
// over what the per-request and per-byte costs make of the same traffic.
// Its parts cost more than the probes of single requests say (on a 16-core
// host, workers spent 5.1-6.0 ms a step against 4.3-4.4 modelled): they go
// out as the backward pass finishes them, each woken and answered on its
// own. 1 where the step was not measured.
struct BspScale {
  double client = 1, server = 1;
};
BspScale BspScaleOf(const ModelSpec& spec, const Calibration& c,
                    const Costs& k) {
  BspScale s;
  const StepTime* t = c.compute.FindStep(spec.batch, spec.layer_sizes);
  if (t == nullptr || !spec.embeddings.empty() || t->streamed_cpu_ms <= 0) {
    return s;
  }
  const ServerTraffic one = Total(StepTraffic(DenseOnly(spec), 1, Mode::kBsp));
  const double client = one.requests * k.cli_req + one.bytes_up * k.cli_push +
                        one.bytes_down * k.cli_pull;
  // The probe's process computes the step too: its data plane is the rest.
  const double measured = t->streamed_cpu_ms * 1e-3 - Cost(t->ms) * 1e-3;
  // Clamped: a probe that a burst of load cut into should not make the
  // model's CPU many times what the requests' probes measured.
  if (client > 0 && measured > 0) {
    s.client = std::clamp(measured / client, 0.5, 3.0);
  }
  if (t->streamed_server_cpu_ms > 0) {
    const double transport = one.requests * k.srv_req +
                             one.bytes_up * k.srv_push +
                             one.bytes_down * k.srv_pull;
    // The probe's tables apply each part with sgd, at once.
    const double served = t->streamed_server_cpu_ms * 1e-3 -
                          one.floats_applied * ApplyCost(c, "sgd");
    if (transport > 0 && served > 0) {
      s.server = std::clamp(served / transport, 0.5, 3.0);
    }
  }
  return s;
}

void PickBottleneck(Prediction* p) {
  p->step_s = std::max({p->critical_s, p->server_s, p->nic_s, p->host_s});
  // On a tie the worker's own path names the bottleneck (the host term
  // equals the critical path when the host has a core for every busy
  // thread, up to rounding).
  if (p->critical_s >= p->step_s * (1 - 1e-9)) {
    // The largest part of the critical path: compute, the round trips, or
    // (BSP) the busiest server's turn.
    const double compute = p->straggler_factor * p->compute.total_s();
    const double trips = p->exposed_comm_s - p->server_wait_s;
    if (p->server_wait_s > compute && p->server_wait_s > trips) {
      p->bottleneck = Bottleneck::kServerCpu;
    } else {
      p->bottleneck =
          trips > compute ? Bottleneck::kLatency : Bottleneck::kCompute;
    }
  } else if (p->step_s == p->server_s) {
    p->bottleneck = Bottleneck::kServerCpu;
  } else if (p->step_s == p->nic_s) {
    p->bottleneck = Bottleneck::kServerNic;
  } else {
    p->bottleneck = Bottleneck::kHostCores;
  }
}

}  // namespace

ComputeEstimate WorkerCompute(const ModelSpec& spec,
                              const ComputeCalibration& c) {
  ComputeEstimate e;
  const double batch = static_cast<double>(spec.batch);
  double bytes = 0;
  for (int l = 0; l < spec.num_layers(); ++l) {
    const double in = static_cast<double>(spec.layer_sizes[l]);
    const double out = static_cast<double>(spec.layer_sizes[l + 1]);
    const double flops = 2 * batch * in * out;
    double fwd, wgrad, dgrad;
    if (const LayerRate* r = c.FindLayer(spec.batch, spec.layer_sizes[l],
                                         spec.layer_sizes[l + 1])) {
      fwd = Rate(r->fwd_gflops) * 1e9;
      wgrad = Rate(r->wgrad_gflops) * 1e9;
      dgrad = Rate(r->dgrad_gflops) * 1e9;
    } else {
      e.roofline = true;
      fwd = RooflineRate(flops, batch, out, in, c);
      wgrad = RooflineRate(flops, in, out, batch, c);
      dgrad = RooflineRate(flops, batch, in, out, c);
    }
    e.forward_s += flops / fwd;
    e.backward_s += flops / wgrad;
    // The first layer's input gradient is not needed.
    if (l > 0) e.backward_s += flops / dgrad;
    bytes += batch * out * kActivationBytesPerFloat;
    if (l == 0) bytes += 2 * 4 * batch * in;  // the batch gathered
  }
  for (const EmbeddingTable& t : spec.embeddings) {
    // Rows gathered into the batch and gradients scattered back.
    bytes += 2 * 4 * batch * t.ids_per_example * t.width;
  }
  e.memory_s = bytes / (Rate(c.memory_gbs) * 1e9);
  e.estimated_s = e.total_s();
  if (const StepTime* t = c.FindStep(spec.batch, spec.layer_sizes);
      t != nullptr && spec.embeddings.empty() && e.estimated_s > 0) {
    const double scale = Cost(t->ms) * 1e-3 / e.estimated_s;
    e.forward_s *= scale;
    e.backward_s *= scale;
    e.memory_s *= scale;
    e.measured_step = true;
  }
  return e;
}

Prediction Predict(const ModelSpec& spec, const Calibration& c,
                   const JobShape& job, const PlanOptions& options) {
  Prediction p;
  p.job = job;
  p.compute = WorkerCompute(spec, c.compute);
  const Costs k = CostsOf(c);
  const int n = std::max(1, job.workers);
  const int b = job.mode == Mode::kBsp ? std::max(0, job.backup_workers) : 0;
  const int s = std::max(1, job.servers);
  const double senders = n + b;
  const double tc = p.compute.total_s();
  const double cv = c.compute.step_cv;

  // Stragglers: BSP waits for the N-th fastest of N + b workers every
  // step; SSP(s) only when one falls s clocks behind, which averages the
  // fluctuations over s + 1 steps; ASP never waits.
  const double slowest = NormalOrderStatistic(n, n + b);
  switch (job.mode) {
    case Mode::kBsp:
      p.straggler_factor = 1 + cv * slowest;
      break;
    case Mode::kSsp:
      p.straggler_factor =
          1 + cv * slowest / std::sqrt(1.0 + std::max(0, job.staleness));
      break;
    case Mode::kAsp:
      p.straggler_factor = 1;
      break;
  }

  // Traffic of one worker step, per server.
  const std::vector<ServerTraffic> dense =
      StepTraffic(DenseOnly(spec), s, job.mode);
  const std::vector<ServerTraffic> emb =
      StepTraffic(EmbeddingsOnly(spec), s, job.mode);
  const double apply = ApplyCost(c, spec.HandlerFor(job.mode));

  // CPU: the client's per worker step, each server's per job step.
  const BspScale scale =
      job.mode == Mode::kBsp ? BspScaleOf(spec, c, k) : BspScale();
  double server_total = 0;
  double server_receive = 0;  // the busiest data thread's receiving
  for (int i = 0; i < s; ++i) {
    ServerTraffic t = Total({dense[i], emb[i]});
    p.client_cpu_s +=
        scale.client * (t.requests * k.cli_req + t.bytes_up * k.cli_push +
                        t.bytes_down * k.cli_pull);
    p.caller_cpu_s +=
        t.requests * k.caller_req + (t.bytes_up + t.bytes_down) * k.caller_byte;
    const double transport = scale.server * senders *
                             (t.requests * k.srv_req + t.bytes_up * k.srv_push +
                              t.bytes_down * k.srv_pull);
    double applied = 0;
    if (job.mode == Mode::kBsp && senders > 1) {
      // Requests held until the step is complete; N gradients summed (rank
      // order) into the step, then one apply.
      applied = senders * t.bytes_up * k.srv_held +
                t.floats_applied * (n * k.apply_sum + apply);
    } else if (job.mode == Mode::kBsp) {
      applied = t.floats_applied * apply;  // straight from the request
    } else {
      applied = senders * t.floats_applied * apply;
    }
    const double cpu = transport + applied;
    // Only the data thread's part is served one request after another:
    // the I/O threads receive and send beside it. Holding, summing and
    // applying are all the data thread's.
    const double turn = k.srv_serial * transport + applied;
    if (turn > p.server_s) {
      p.server_s = turn;
      // Of it, receiving the workers' requests and gradients (half of a
      // request's fixed cost, all of the bytes up).
      server_receive = scale.server * k.srv_serial * senders *
                       (t.requests * k.srv_req / 2 + t.bytes_up * k.srv_push);
    }
    server_total += cpu;
    if (cpu > p.busiest.cpu_s || i == 0) {
      p.busiest.index = i;
      p.busiest.cpu_s = cpu;
      p.busiest.requests = senders * t.requests;
      p.busiest.bytes_in = senders * t.bytes_up;
      p.busiest.bytes_out = senders * t.bytes_down;
    }
  }
  p.servers_cpu_s = server_total;
  // Every step reports its clock to the scheduler.
  p.client_cpu_s += k.control_cli;

  // What the worker waits for on the data plane.
  double dense_up = 0, dense_down = 0;  // to the busiest destination
  double dense_total = 0;
  for (const ServerTraffic& t : dense) {
    dense_up = std::max(dense_up, t.bytes_up);
    dense_down = std::max(dense_down, t.bytes_down);
    dense_total += t.bytes_up;
  }
  // The training thread computes and issues its own requests.
  const double g_tc = p.straggler_factor * (tc + p.caller_cpu_s);
  double exposed = 0;
  if (dense_total > 0) {
    switch (job.mode) {
      case Mode::kBsp: {
        // Parts go out as the backward pass finishes them, and the last
        // one's round trip stays exposed. Workers and servers take turns:
        // a server answers a part only once every worker's gradient of it
        // is in, so the apply and the replies of the whole step lie on the
        // path. The replies go out one worker after another, so the
        // workers answered first start the next step ahead of the last,
        // and their requests are received while it still computes: of the
        // receiving, only the last worker's share waits (when the compute
        // covers the others'). At the least the turn is the last part's
        // own work: its push, its apply, the replies to the workers
        // answered before.
        const double x = std::min<double>(kBspPartBytes, dense_total);
        const double last_part =
            x * k.srv_push + x / 4 * apply + (senders - 1) / 2 * x * k.srv_pull;
        const double early =
            std::min(g_tc, (senders - 1) / senders * server_receive);
        p.server_wait_s = std::max(last_part, p.server_s - early);
        exposed = k.alpha + x / k.push_bps + x / k.pull_bps + p.server_wait_s;
        break;
      }
      case Mode::kSsp:
        // Pull, compute, push: nothing overlaps.
        exposed = 2 * k.alpha + dense_down / k.pull_bps + dense_up / k.push_bps;
        break;
      case Mode::kAsp: {
        // Step c's PushPull flies while step c + 1 computes.
        const double x =
            k.alpha + dense_up / k.push_bps + dense_down / k.pull_bps;
        exposed = std::max(0.0, x - g_tc);
        break;
      }
    }
  }
  // Embedding rows are pulled before and pushed after the step, in every
  // mode (the sparse loop).
  double emb_up = 0, emb_down = 0;
  for (const ServerTraffic& t : emb) {
    emb_up = std::max(emb_up, t.bytes_up);
    emb_down = std::max(emb_down, t.bytes_down);
  }
  if (!spec.embeddings.empty()) {
    exposed += 2 * k.alpha + emb_up / k.push_bps + emb_down / k.pull_bps;
  }
  p.exposed_comm_s = exposed;
  p.critical_s = g_tc + exposed;

  if (options.placement == Placement::kSharedHost) {
    // Every worker's compute and data-plane CPU and every server's work,
    // on the cores the host gives the job's busy threads: as many as that
    // CPU keeps busy over the critical path, at least one, at most two per
    // process: a worker's I/O threads send and receive while its training
    // thread computes, a server's beside its data thread (on a 16-core
    // host, 8 ASP workers and one server kept 10.9 cores busy; a cap of
    // one per process predicted them 27-30% slow).
    const double cpu =
        senders * (tc + p.client_cpu_s + k.control_sched) + server_total;
    const double busy = std::clamp(cpu / p.critical_s, 1.0, 2 * (senders + s));
    p.effective_cores = EffectiveCores(c, options, busy);
    p.host_s = cpu / p.effective_cores;
  } else {
    const double in_bps =
        options.nic_gbs > 0 ? options.nic_gbs * 1e9 : k.push_bps_k;
    const double out_bps =
        options.nic_gbs > 0 ? options.nic_gbs * 1e9 : k.pull_bps_k;
    const ServerTraffic w = Total({Total(dense), Total(emb)});
    p.nic_s =
        std::max({p.busiest.bytes_in / in_bps, p.busiest.bytes_out / out_bps,
                  w.bytes_up / in_bps, w.bytes_down / out_bps});
  }
  PickBottleneck(&p);
  p.examples_per_s = n * static_cast<double>(spec.batch) / p.step_s;
  return p;
}

Prediction PredictAllReduce(const ModelSpec& spec, const Calibration& c,
                            int workers, AllReduce algorithm,
                            const PlanOptions& options) {
  Prediction p;
  const int n = std::max(1, workers);
  p.job.workers = n;
  p.job.servers = 0;
  p.job.mode = Mode::kBsp;
  p.compute = WorkerCompute(spec, c.compute);
  const Costs k = CostsOf(c);
  double floats = static_cast<double>(spec.DenseFloats());
  for (const EmbeddingTable& e : spec.embeddings) {
    floats += spec.DistinctIds(e) * e.width;
  }
  const double d = 4 * floats;
  double time = 0, moved = 0, messages = 0, reduced = 0;
  if (n > 1) {
    if (algorithm == AllReduce::kRing) {
      // Reduce-scatter then all-gather: 2 (N - 1) steps of D / N bytes.
      messages = 2.0 * (n - 1);
      moved = messages * d / n;
      reduced = (n - 1.0) / n * floats;
      time = messages * k.alpha + moved / k.push_bps + reduced * k.apply_sum;
    } else {
      // A binary tree: reduce to the root, then broadcast, log2 N levels
      // of whole gradients each way.
      const double levels = std::ceil(std::log2(static_cast<double>(n)));
      messages = 2 * levels;
      moved = 2 * levels * d;
      reduced = levels * floats;
      time = messages * (k.alpha + d / k.push_bps) + reduced * k.apply_sum;
    }
  }
  // Each worker applies the update itself.
  const double update = floats * ApplyCost(c, spec.HandlerFor(Mode::kBsp));
  p.straggler_factor = 1 + c.compute.step_cv * NormalOrderStatistic(n, n);
  const double tc = p.compute.total_s();
  // Buckets are reduced while the backward pass goes on; what outlasts it
  // is exposed, and at least one round trip always is.
  p.exposed_comm_s =
      n > 1 ? std::max(k.alpha, time - p.compute.backward_s) + update : update;
  p.critical_s = p.straggler_factor * tc + p.exposed_comm_s;
  p.client_cpu_s = messages * k.cli_req + moved * (k.cli_push + k.cli_pull) +
                   reduced * k.apply_sum + update;
  if (options.placement == Placement::kSharedHost) {
    const double cpu = n * (tc + p.client_cpu_s);
    p.effective_cores = EffectiveCores(
        c, options,
        std::clamp(cpu / p.critical_s, 1.0, static_cast<double>(n)));
    p.host_s = cpu / p.effective_cores;
  } else {
    const double bps =
        options.nic_gbs > 0 ? options.nic_gbs * 1e9 : k.push_bps_k;
    p.nic_s = moved / bps;
  }
  PickBottleneck(&p);
  p.examples_per_s = n * static_cast<double>(spec.batch) / p.step_s;
  return p;
}

}  // namespace planner
}  // namespace downpour
