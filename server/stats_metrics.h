// The figures of a ps_server as Prometheus metrics: its ServerStats (what
// GetStats answers) and its per-request figures, written at scrape time.
// Names and labels are listed in docs/OPERATIONS.md ("Metrics").
#ifndef DOWNPOUR_SERVER_STATS_METRICS_H_
#define DOWNPOUR_SERVER_STATS_METRICS_H_

#include <vector>

#include "metrics/registry.h"
#include "metrics/request_stats.h"
#include "proto/downpour.pb.h"

namespace downpour {

// Request cells use the data header's op, or this one for server-to-server
// replication messages.
inline constexpr uint32_t kReplicationOp = 100;

// `ready`: registered and serving (then `stats` is filled). Tables are
// labelled by name, as `stats` lists them (by id when it does not).
void WriteServerMetrics(bool ready, const proto::ServerStats& stats,
                        const std::vector<RequestStats::Cell>& requests,
                        MetricWriter* w);

}  // namespace downpour

#endif  // DOWNPOUR_SERVER_STATS_METRICS_H_
