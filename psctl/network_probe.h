// What `psctl calibrate` measures on the data and control planes: a
// client against one server of a cluster (latency, bandwidth with 1 and k
// requests in flight, CPU per request and per byte in this process, its
// calling thread and, when it runs here, the server; what a BSP request
// held for aggregation costs the server), and the cost of a worker's clock
// report.
//
// The probes create scratch tables ("psctl-calibrate-<pid>-<ms>", a few
// message sizes of rows) on the cluster. They block for about rounds x
// seconds each. Thread-compatible: one call at a time per client.
#ifndef DOWNPOUR_PSCTL_NETWORK_PROBE_H_
#define DOWNPOUR_PSCTL_NETWORK_PROBE_H_

#include <sys/types.h>

#include <cstddef>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "client/client.h"
#include "common/auth.h"
#include "planner/calibration.h"
#include "psctl/compute_probe.h"

namespace downpour {

struct NetworkProbeOptions {
  ProbeOptions probe;
  size_t message_bytes = size_t{128} << 10;
  int in_flight = 4;
  int servers = 1;    // live servers (tables are cut among them)
  pid_t server = -1;  // the first server's pid, when it runs on this host
  // The sgd handler's apply cost, taken out of a push's server CPU.
  double sgd_ns_per_float = 0;
};

// The data plane against the cluster's first server. `second` is another
// client of the same cluster (the second rank of the BSP probe). Errors:
// the client's, with what was being measured.
absl::StatusOr<planner::NetworkCalibration> ProbeNetwork(
    Client& client, Client& second, const NetworkProbeOptions& o);

// One whole step of the dense model `spec` as ps_worker's BSP loop runs it
// against a server: each ~128 KiB part of the gradient sent as a PushPull
// the moment the backward pass finishes it, its reply written into the
// parameters, to tables that apply each push at once (one rank,
// sync_workers = 1). Milliseconds from the step's start to the end of its
// backward pass, the sends overlapped (the wait for the last replies left
// out), as ps_worker logs its compute; the CPU its client and the replies
// take beside the products is what makes it longer than MeasureStep's.
// Also the CPU per step, replies included: of this process and, with
// `server` (its pid, on this host), of the server. Creates synchronous
// tables: for a cluster of one's own (psctl calibrate runs it against its
// local cluster only). Errors: the client's. REQUIRES: spec has dense
// layers.
struct StreamedStep {
  planner::Spread ms;
  double cpu_ms = 0;
  double server_cpu_ms = 0;  // 0: not measured
};
absl::StatusOr<StreamedStep> ProbeStreamedStep(Client& client,
                                               const planner::ModelSpec& spec,
                                               const ProbeOptions& o,
                                               pid_t server = -1);

// A worker's clock report (every step makes one), into n's control_*
// figures. With `scheduler_pid` (a local cluster whose scheduler runs
// with --consistency=asp --num_workers=1), this process joins the job and
// reports clocks as ps_worker does, each flushed, and the scheduler's CPU
// is read from /proc. Without it (a live cluster, whose job must not be
// joined), a small gRPC call to the scheduler stands in, and the caller's
// CPU for the scheduler's.
absl::Status ProbeControl(const std::string& scheduler, const ClusterAuth& auth,
                          pid_t scheduler_pid, const ProbeOptions& o,
                          planner::NetworkCalibration* n);

}  // namespace downpour

#endif  // DOWNPOUR_PSCTL_NETWORK_PROBE_H_
