// A plan: the performance model (planner/perf_model.h) over a grid of
// worker counts, server counts and modes, all-reduce beside it, and the
// recommended configuration; its JSON form (`psctl plan --json`) and the
// gnuplot input of its plot (throughput against workers, one line per
// server count, a panel per mode).
//
//   PlanRequest r;
//   DP_ASSIGN_OR_RETURN(r.workers, ParseCounts("1..8", "--workers"));
//   r.servers = {1, 2, 4};
//   Plan plan = MakePlan(model, calibration, r);
//   plan.rows[plan.recommended] ...
//
// Pure functions; thread-safe.
#ifndef DOWNPOUR_PLANNER_PLAN_H_
#define DOWNPOUR_PLANNER_PLAN_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "planner/calibration.h"
#include "planner/json.h"
#include "planner/model_spec.h"
#include "planner/perf_model.h"

namespace downpour {
namespace planner {

struct PlanRequest {
  std::vector<int> workers = {1};
  std::vector<int> servers = {1};
  std::vector<Mode> modes = {Mode::kBsp, Mode::kSsp, Mode::kAsp};
  int backup_workers = 0;  // BSP rows only
  int staleness = 3;       // SSP
  PlanOptions options;
};

// Configurations whose throughput is within this fraction of the fastest
// count as equally fast; among them the recommendation takes the fewest
// processes, then BSP before SSP before ASP (fresher updates).
inline constexpr double kRecommendTolerance = 0.03;

struct Plan {
  PlanRequest request;
  // Workers x servers x modes, in that nesting order.
  std::vector<Prediction> rows;
  // Per worker count: ring, then tree.
  std::vector<Prediction> all_reduce;
  size_t recommended = 0;  // index into rows
  std::string reason;      // why, in one sentence
};

// REQUIRES: request's lists non-empty, counts >= 1.
Plan MakePlan(const ModelSpec& spec, const Calibration& c,
              const PlanRequest& request);

// `psctl plan --json`: the model, the calibration's identity, every row
// (its terms, bottleneck, busiest server), the all-reduce rows and the
// recommendation.
Json PlanToJson(const Plan& plan, const ModelSpec& spec, const Calibration& c);

// The plot's data (one block per mode and server count, gnuplot's "index"
// blocks: workers, examples/s) and the script that draws `png` from the
// data file `data_path`.
std::string PlotData(const Plan& plan);
std::string GnuplotScript(const Plan& plan, const std::string& data_path,
                          const std::string& png, const std::string& title);

// "4" (one count), "1..8" (a range), "1,2,4" (a list), or a mix ("1,2,4..6").
// kInvalidArgument naming `flag` for anything else, counts < 1 or > 4096.
absl::StatusOr<std::vector<int>> ParseCounts(absl::string_view text,
                                             absl::string_view flag);
// "bsp,ssp,asp" (any subset). kInvalidArgument naming `flag`.
absl::StatusOr<std::vector<Mode>> ParseModes(absl::string_view text,
                                             absl::string_view flag);

}  // namespace planner
}  // namespace downpour

#endif  // DOWNPOUR_PLANNER_PLAN_H_
