#include "metrics/metrics_flags.h"

#include <string>

#include "absl/flags/flag.h"
#include "common/logging.h"
#include "common/status_macros.h"

ABSL_FLAG(std::string, metrics_listen, "",
          "serve Prometheus metrics at http://HOST:PORT/metrics (port 0: any "
          "free port); empty: no metrics endpoint");

namespace downpour {

bool MetricsFlagSet() { return !absl::GetFlag(FLAGS_metrics_listen).empty(); }

absl::StatusOr<std::unique_ptr<MetricsEndpoint>> StartMetricsFromFlags(
    MetricsRegistry* registry) {
  const std::string listen = absl::GetFlag(FLAGS_metrics_listen);
  if (listen.empty()) return nullptr;
  auto endpoint = std::make_unique<MetricsEndpoint>();
  DP_ASSIGN_OR_RETURN(endpoint->http,
                      MetricsHttpServer::Start(listen, registry),
                      "--metrics_listen");
  endpoint->process = AddProcessMetrics(registry);
  DP_LOG(INFO) << "metrics on http://" << listen.substr(0, listen.rfind(':'))
               << ":" << endpoint->http->port() << "/metrics";
  return endpoint;
}

}  // namespace downpour
