#include "planner/traffic.h"

#include <algorithm>

namespace downpour {
namespace planner {
namespace {

// Bytes of a key on the wire (uint64).
constexpr double kKeyBytes = 8;

// Rows [begin, end) of server i's range of a table of `rows` rows on
// `servers` servers (scheduler/placement.cc's PlaceTable).
void RangeOf(int64_t rows, int servers, int i, int64_t* begin, int64_t* end) {
  const int64_t parts = std::min<int64_t>(rows, servers);
  if (i >= parts) {
    *begin = *end = 0;
    return;
  }
  *begin = rows * i / parts;
  *end = rows * (i + 1) / parts;
}

}  // namespace

std::vector<ServerTraffic> StepTraffic(const ModelSpec& spec, int servers,
                                       Mode mode) {
  std::vector<ServerTraffic> out(static_cast<size_t>(std::max(1, servers)));
  for (const DenseBlock& b : spec.DenseBlocks()) {
    const int64_t part_rows = std::max<int64_t>(
        1, static_cast<int64_t>(kBspPartBytes) / (b.width * 4));
    for (int i = 0; i < servers; ++i) {
      int64_t begin, end;
      RangeOf(b.rows, servers, i, &begin, &end);
      if (begin >= end) continue;
      ServerTraffic& t = out[i];
      const double bytes = static_cast<double>(end - begin) * b.width * 4;
      t.bytes_up += bytes;
      t.bytes_down += bytes;
      t.floats_applied += bytes / 4;
      switch (mode) {
        case Mode::kBsp: {
          // Parts [p * part_rows, ...) that overlap [begin, end).
          const int64_t first = begin / part_rows;
          const int64_t last = (end - 1) / part_rows;
          t.requests += static_cast<double>(last - first + 1);
          break;
        }
        case Mode::kAsp:
          t.requests += 1;
          break;
        case Mode::kSsp:
          t.requests += 2;  // a pull and a push
          break;
      }
    }
  }
  for (const EmbeddingTable& e : spec.embeddings) {
    const double ids = spec.DistinctIds(e) / servers;
    for (ServerTraffic& t : out) {
      // Pull: keys up, rows down. Push: keys and gradients up.
      t.requests += 2;
      t.bytes_up += ids * kKeyBytes * 2 + ids * e.width * 4;
      t.bytes_down += ids * e.width * 4;
      t.floats_applied += ids * e.width;
    }
  }
  return out;
}

ServerTraffic Total(const std::vector<ServerTraffic>& per_server) {
  ServerTraffic sum;
  for (const ServerTraffic& t : per_server) {
    sum.requests += t.requests;
    sum.bytes_up += t.bytes_up;
    sum.bytes_down += t.bytes_down;
    sum.floats_applied += t.floats_applied;
  }
  return sum;
}

}  // namespace planner
}  // namespace downpour
