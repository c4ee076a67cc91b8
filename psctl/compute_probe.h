// What `psctl calibrate` measures without a cluster: a worker's compute
// (the model's layer products as the workers compute them: Eigen,
// row-major floats, one thread), a large GEMM, memory bandwidth, how many
// cores the host really gives to busy threads, the spread of a step's
// compute, and a server's update cost per float for each handler.
//
// Every probe runs `rounds` rounds of about `seconds` each and reports the
// spread of its timed calls (planner::Spread). They block for that
// long and use the calling thread (CoreSpeedup also starts threads, joined
// before it returns). Thread-compatible.
#ifndef DOWNPOUR_PSCTL_COMPUTE_PROBE_H_
#define DOWNPOUR_PSCTL_COMPUTE_PROBE_H_

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "models/dataset.h"
#include "planner/calibration.h"
#include "planner/model_spec.h"

namespace downpour {

struct ProbeOptions {
  int rounds = 5;
  double seconds = 0.2;  // per round
};

// A 512 x 512 x 512 product, GFLOP/s.
planner::Spread GemmPeakGflops(const ProbeOptions& o);
// memcpy of 64 MiB, (bytes read + written) / s, in GB/s.
planner::Spread MemoryGbs(const ProbeOptions& o);
// One layer's forward, weight-gradient and input-gradient products at
// `batch`, GFLOP/s each.
planner::LayerRate MeasureLayer(int64_t batch, int64_t in, int64_t out,
                                const ProbeOptions& o);
// For 1, 2, 4, ... busy threads (and `cores`, up to max(8, 2 x cores)):
// their aggregate GEMM rate over the rate of one thread that has a core to
// itself (planner::ComputeCalibration::effective_cores): the median of
// three rounds, each against one thread's rate taken just before it, and
// never more than the threads or `cores`. Takes about 4.5 x `seconds` per
// count.
std::vector<std::pair<int64_t, double>> EffectiveCores(int cores,
                                                       double seconds);
// The examples the step probes train on: 4096 of the model's input size
// and classes, the same every time. REQUIRES: spec has dense layers.
Dataset ProbeData(const planner::ModelSpec& spec);
// One whole step of the dense model `spec` as ps_worker computes it (the
// MLP of models/, one thread, on random data: a mini-batch drawn, loss and
// gradient streamed), in milliseconds per call. REQUIRES: spec has dense
// layers.
planner::StepTime MeasureStep(const planner::ModelSpec& spec,
                              const ProbeOptions& o);
// The relative spread of the time of one step's products (every layer of
// `spec`, forward and backward) over `samples` steps, as
// planner::ComputeCalibration::step_cv defines it. 0 for a model without
// dense layers.
double StepCv(const planner::ModelSpec& spec, int samples);
// The handler's Apply over 1 MiB of rows (width 256), ns per float.
// kInvalidArgument for an unknown handler.
absl::StatusOr<planner::Spread> ApplyNsPerFloat(const std::string& handler,
                                                const ProbeOptions& o);

}  // namespace downpour

#endif  // DOWNPOUR_PSCTL_COMPUTE_PROBE_H_
