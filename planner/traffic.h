// What one worker step sends to each server: requests, bytes each way and
// floats the server applies, for a model, a server count and a mode. It
// follows the code it models: the scheduler's placement (a dense table of R
// rows on S servers is cut into min(R, S) ranges [R*i/parts,
// R*(i+1)/parts), range i on server i, so 1-row tables all land on server
// 0), and the worker loops (BSP: one PushPull per ~128 KiB part of each
// table, cut at server boundaries; pipelined ASP: one PushPull per table;
// SSP: a pull and a push per table; embeddings: a pull and a push of the
// batch's distinct ids, spread evenly over all servers).
#ifndef DOWNPOUR_PLANNER_TRAFFIC_H_
#define DOWNPOUR_PLANNER_TRAFFIC_H_

#include <cstdint>
#include <vector>

#include "planner/model_spec.h"
#include "worker/bsp_parts.h"  // kBspPartBytes: how BSP cuts its PushPulls

namespace downpour {
namespace planner {

struct ServerTraffic {
  double requests = 0;        // data-plane requests (a PushPull counts once)
  double bytes_up = 0;        // worker -> server: gradients (and keys)
  double bytes_down = 0;      // server -> worker: parameters
  double floats_applied = 0;  // gradient floats this server updates with
};

// Per server, for one step of one worker. REQUIRES: servers >= 1.
std::vector<ServerTraffic> StepTraffic(const ModelSpec& spec, int servers,
                                       Mode mode);

// The sum over servers.
ServerTraffic Total(const std::vector<ServerTraffic>& per_server);

}  // namespace planner
}  // namespace downpour

#endif  // DOWNPOUR_PLANNER_TRAFFIC_H_
