// How a BSP worker cuts its gradient into PushPull parts, and which parts a
// finished stretch of the gradient completes. One definition for the
// worker's BSP loop (worker/internal/bsp_loop.cc), psctl calibrate's
// streamed step, which measures that loop's step, and the planner, which
// models its traffic (planner/traffic.h).
//
//   BspPartTracker parts(CutBspParts(model.Blocks()));
//   parts.Reset();                                   // a new step
//   model.LossAndGradientStreamed(..., [&](size_t off, size_t n) {
//     parts.Ready(off, n, [&](const BspPart& p) { /* PushPull p */ });
//   });
#ifndef DOWNPOUR_WORKER_BSP_PARTS_H_
#define DOWNPOUR_WORKER_BSP_PARTS_H_

#include <algorithm>
#include <cstddef>
#include <utility>
#include <vector>

#include "common/types.h"
#include "models/model.h"

namespace downpour {

// A large table's PushPull goes out as row ranges of about this size, so
// that a server applies and answers the first while the next are still
// being computed or sent.
inline constexpr size_t kBspPartBytes = 128 << 10;

// Rows [begin, end) of table `table` (an index into the model's blocks):
// floats [offset, offset + count) of the flat parameter array.
struct BspPart {
  size_t table;
  Key begin, end;
  size_t offset, count;
};

// Every table cut into row ranges of about kBspPartBytes, in parameter
// order. The cut depends on the model only, so every worker cuts the same
// way: BSP aggregates per range and clock, so all workers must push the
// same ranges.
std::vector<BspPart> CutBspParts(const std::vector<ParamBlock>& blocks);

// Which parts of one step's gradient are final.
class BspPartTracker {
 public:
  explicit BspPartTracker(std::vector<BspPart> parts)
      : parts_(std::move(parts)), ready_(parts_.size(), 0) {}

  const std::vector<BspPart>& parts() const { return parts_; }
  // A new step: no float is final.
  void Reset() { std::fill(ready_.begin(), ready_.end(), 0); }
  // Floats [offset, offset + count) are final: calls done(part) for each
  // part that they complete, in parameter order. Each float is reported
  // once a step.
  template <typename F>
  void Ready(size_t offset, size_t count, F done) {
    for (size_t i = 0; i < parts_.size(); ++i) {
      const BspPart& p = parts_[i];
      const size_t b = std::max(offset, p.offset);
      const size_t e = std::min(offset + count, p.offset + p.count);
      if (b >= e) continue;
      ready_[i] += e - b;
      if (ready_[i] == p.count) done(p);
    }
  }

 private:
  std::vector<BspPart> parts_;
  std::vector<size_t> ready_;  // floats of each part known to be final
};

}  // namespace downpour

#endif  // DOWNPOUR_WORKER_BSP_PARTS_H_
