// The metrics flag every daemon shares:
//
//   --metrics_listen=HOST:PORT   serve Prometheus metrics at
//                                http://HOST:PORT/metrics (port 0: any free
//                                one, logged); empty (default): off
//
// A daemon's main() owns a MetricsRegistry, hands it to its component's
// options and calls StartMetricsFromFlags; libraries never read the flag.
#ifndef DOWNPOUR_METRICS_METRICS_FLAGS_H_
#define DOWNPOUR_METRICS_METRICS_FLAGS_H_

#include <memory>

#include "absl/status/statusor.h"
#include "metrics/http_server.h"
#include "metrics/registry.h"

namespace downpour {

// The metrics endpoint and this process's process_* figures. nullptr
// (and nothing started) when --metrics_listen is empty; its errors
// (kInvalidArgument, kUnavailable) otherwise. `registry` must outlive the
// result.
struct MetricsEndpoint {
  MetricsRegistry::Registration process;
  std::unique_ptr<MetricsHttpServer> http;
};
absl::StatusOr<std::unique_ptr<MetricsEndpoint>> StartMetricsFromFlags(
    MetricsRegistry* registry);

// Whether --metrics_listen is set (a component then gets the registry).
bool MetricsFlagSet();

}  // namespace downpour

#endif  // DOWNPOUR_METRICS_METRICS_FLAGS_H_
