// The performance model: the step time of a data-parallel job on Downpour
// (N workers, b backup workers, S servers, BSP / SSP(s) / ASP) or with
// all-reduce (ring or tree, as DDP would run it), from a model description
// and a calibration. docs/ARCHITECTURE.md ("Sizing a job: the performance
// model") gives the equations; in short, a step takes the largest of
//
//   critical path   g * (Tc + the training thread's own share of the
//                   data plane's CPU) + (communication it waits for)
//   busiest server  the CPU its data thread spends per step (all workers)
//   NIC             bytes through the busiest server's or a worker's link
//                   (one host per process only)
//   host cores      all processes' CPU per step (compute, data plane,
//                   clock reports) / the cores the host gives them
//                   (everything on one host only, as psctl local runs it)
//
// where Tc is one worker's compute (each layer's products at their
// calibrated rates, plus memory traffic) and g the straggler factor
// (1 + cv * E[slowest of N], less under SSP, 1 under ASP).
//
//   DP_ASSIGN_OR_RETURN(ModelSpec m, ReadModelSpec("mlp.json"));
//   DP_ASSIGN_OR_RETURN(Calibration c, ReadCalibration("cal.json"));
//   Prediction p = Predict(m, c, {.workers = 4, .servers = 2,
//                                 .mode = Mode::kBsp}, PlanOptions{});
//   p.examples_per_s, p.bottleneck ...
//
// Pure functions of their arguments; thread-safe.
#ifndef DOWNPOUR_PLANNER_PERF_MODEL_H_
#define DOWNPOUR_PLANNER_PERF_MODEL_H_

#include <string>

#include "planner/calibration.h"
#include "planner/model_spec.h"

namespace downpour {
namespace planner {

struct JobShape {
  int workers = 1;         // N, whose updates count
  int backup_workers = 0;  // b (BSP)
  int servers = 1;         // S
  Mode mode = Mode::kBsp;
  int staleness = 3;  // SSP's bound s
};

enum class Placement {
  kSharedHost,      // every process on one host (psctl local, ps_demo)
  kDedicatedHosts,  // one host per worker and per server
};

struct PlanOptions {
  Placement placement = Placement::kSharedHost;
  // Shared host: the cores its processes share (0: the calibration's).
  int cores = 0;
  // Dedicated hosts: each host's link in GB/s per direction (0: the
  // calibration's rates with k requests in flight).
  double nic_gbs = 0;
};

enum class Bottleneck {
  kCompute,    // the workers' own computation (with stragglers)
  kLatency,    // round trips the worker waits for
  kServerCpu,  // the busiest server's data thread
  kServerNic,  // the busiest server's (or a worker's) link
  kHostCores,  // the cores every process shares
};
const char* BottleneckName(Bottleneck b);  // "compute", "latency", ...

// One worker step's compute, uncontended.
struct ComputeEstimate {
  double forward_s = 0;
  double backward_s = 0;  // weight and input gradients
  double memory_s = 0;    // element-wise passes, gathers
  double total_s() const { return forward_s + backward_s + memory_s; }
  // Some layer's rate came from the roofline (its shape was not
  // calibrated): min(peak GEMM rate, arithmetic intensity x bandwidth).
  bool roofline = false;
  // The calibration measured this model's whole step: the total is that
  // time, split in the proportions of the layer estimate above;
  // `estimated_s` keeps the layer estimate.
  bool measured_step = false;
  double estimated_s = 0;
};
ComputeEstimate WorkerCompute(const ModelSpec& spec,
                              const ComputeCalibration& c);

struct ServerLoad {
  int index = 0;  // the busiest server, in the scheduler's placement order
  // Per job step (every worker's step once).
  double requests = 0;
  double bytes_in = 0;
  double bytes_out = 0;
  double cpu_s = 0;
};

struct Prediction {
  JobShape job;
  ComputeEstimate compute;
  double straggler_factor = 1;  // g
  double exposed_comm_s = 0;    // communication on the worker's path
  // BSP: of exposed_comm_s, the busiest server's turn (its work of the
  // step, which the workers wait for before the next).
  double server_wait_s = 0;
  double critical_s = 0;  // g * Tc + exposed_comm_s
  // One worker's CPU per step beyond its compute: the data plane's (client
  // threads and the calling thread) and its clock report's.
  double client_cpu_s = 0;
  double caller_cpu_s = 0;     // of which on the training thread
  double server_s = 0;         // the busiest server's data thread per job step
  double servers_cpu_s = 0;    // all servers' CPU per job step
  double nic_s = 0;            // dedicated hosts only
  double host_s = 0;           // shared host only
  double effective_cores = 0;  // shared host only
  double step_s = 0;           // the largest of the four
  double examples_per_s = 0;   // N * batch / step_s
  Bottleneck bottleneck = Bottleneck::kCompute;
  ServerLoad busiest;
};

Prediction Predict(const ModelSpec& spec, const Calibration& c,
                   const JobShape& job, const PlanOptions& options);

enum class AllReduce { kRing, kTree };
const char* AllReduceName(AllReduce a);  // "ring", "tree"

// The same model's gradients all-reduced among N workers (no servers), each
// worker then applying the update itself, as DDP runs it: the all-reduce
// overlaps the backward pass; dense parameters only (embedding tables are
// counted as dense gradients of their distinct rows).
Prediction PredictAllReduce(const ModelSpec& spec, const Calibration& c,
                            int workers, AllReduce algorithm,
                            const PlanOptions& options);

}  // namespace planner
}  // namespace downpour

#endif  // DOWNPOUR_PLANNER_PERF_MODEL_H_
