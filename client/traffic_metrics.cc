#include "client/traffic_metrics.h"

namespace downpour {

void WriteClientTrafficMetrics(const TrafficStats& traffic, MetricWriter* w) {
  w->Counter("downpour_client_requests_total",
             "Data-plane requests this client sent", {},
             static_cast<double>(traffic.requests));
  w->Counter("downpour_client_sent_bytes_total",
             "Data-plane bytes this client sent", {},
             static_cast<double>(traffic.bytes_sent));
  w->Counter("downpour_client_received_bytes_total",
             "Data-plane bytes this client received", {},
             static_cast<double>(traffic.bytes_received));
}

}  // namespace downpour
