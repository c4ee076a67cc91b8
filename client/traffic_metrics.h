// The Prometheus figures of a client's data-plane traffic, for programs that
// export metrics (ps_worker, ps_lbfgs): one definition of their names, so
// that dashboards read every program alike.
#ifndef DOWNPOUR_CLIENT_TRAFFIC_METRICS_H_
#define DOWNPOUR_CLIENT_TRAFFIC_METRICS_H_

#include "client/client.h"
#include "metrics/registry.h"

namespace downpour {

// Writes downpour_client_{requests,sent_bytes,received_bytes}_total.
void WriteClientTrafficMetrics(const TrafficStats& traffic, MetricWriter* w);

}  // namespace downpour

#endif  // DOWNPOUR_CLIENT_TRAFFIC_METRICS_H_
