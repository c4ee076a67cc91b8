// Serves a MetricsRegistry to Prometheus: GET /metrics answers with the
// text exposition format, produced by prometheus-cpp (the only code that
// uses it). Every daemon starts one from its --metrics_listen flag.
//
//   MetricsRegistry registry;
//   DP_ASSIGN_OR_RETURN(auto http, MetricsHttpServer::Start("0.0.0.0:9100",
//                                                          &registry));
//   ... http->port() ...
//
// No authentication (Prometheus' usual arrangement; the figures hold no
// secrets): restrict who can reach the port (deploy/k8s's NetworkPolicy).
// Thread-safe.
#ifndef DOWNPOUR_METRICS_HTTP_SERVER_H_
#define DOWNPOUR_METRICS_HTTP_SERVER_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "metrics/registry.h"

namespace downpour {

class MetricsHttpServer {
 public:
  // Listens on `listen_address` ("host:port"; port 0 picks a free one) and
  // serves `registry`, which must outlive the server. kInvalidArgument for
  // an address without a port; kUnavailable if it cannot be bound.
  static absl::StatusOr<std::unique_ptr<MetricsHttpServer>> Start(
      const std::string& listen_address, const MetricsRegistry* registry);
  virtual ~MetricsHttpServer() = default;  // stops serving

  // The bound port.
  virtual int port() const = 0;
};

// What GET /metrics answers: the registry's figures in Prometheus' text
// format.
std::string MetricsText(const MetricsRegistry& registry);

}  // namespace downpour

#endif  // DOWNPOUR_METRICS_HTTP_SERVER_H_
