// Order statistics of normal variables, for the straggler terms of the
// performance model: under BSP a step waits for the slowest of N workers
// (with b backup workers, for the N-th fastest of N + b).
#ifndef DOWNPOUR_PLANNER_ORDER_STATS_H_
#define DOWNPOUR_PLANNER_ORDER_STATS_H_

namespace downpour {
namespace planner {

// E[X_(k:n)], the expected k-th smallest of n independent standard normal
// variables, by numerical integration (error below 1e-6). E.g. the largest
// of 2: 0.5642; of 4: 1.0294; of 8: 1.4236. REQUIRES: 1 <= k <= n <= 10000.
double NormalOrderStatistic(int k, int n);

}  // namespace planner
}  // namespace downpour

#endif  // DOWNPOUR_PLANNER_ORDER_STATS_H_
