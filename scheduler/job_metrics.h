// The figures of a ps_scheduler as Prometheus metrics, written at scrape
// time from its cluster map, job status and event counters: the whole
// job's health in one place (nodes, ranges and their replicas, clocks and
// staleness per worker). Names and labels are listed in
// docs/OPERATIONS.md ("Metrics").
#ifndef DOWNPOUR_SCHEDULER_JOB_METRICS_H_
#define DOWNPOUR_SCHEDULER_JOB_METRICS_H_

#include <cstdint>

#include "metrics/registry.h"
#include "proto/downpour.pb.h"

namespace downpour {

// Events the scheduler counts (the map only shows the present).
struct SchedulerEvents {
  uint64_t servers_declared_dead = 0;
  uint64_t workers_declared_dead = 0;
  // Ranges whose primary died and that an in-sync backup took over.
  uint64_t promotions = 0;
  uint64_t ranges_lost = 0;  // ranges marked lost (no holder had the data)
  // Range moves (scale out, drains: scheduler/moves.h) started, and ended
  // (completed or cancelled).
  uint64_t moves_started = 0;
  uint64_t moves_done = 0;
  // Range splits (scheduler/splits.h) started, and completed (a split
  // called off is started but never completed).
  uint64_t splits_started = 0;
  uint64_t splits_done = 0;
  // Merges of neighbouring ranges, likewise.
  uint64_t merges_started = 0;
  uint64_t merges_done = 0;
};

void WriteSchedulerMetrics(const proto::ClusterMap& map,
                           const proto::JobStatus& job,
                           const SchedulerEvents& events, MetricWriter* w);

// Ranges of `map` for which `node` is primary (to count promotions: the
// difference before and after the node leaves).
int PrimaryRangesOf(const proto::ClusterMap& map, uint64_t node);
int LostRanges(const proto::ClusterMap& map);

}  // namespace downpour

#endif  // DOWNPOUR_SCHEDULER_JOB_METRICS_H_
