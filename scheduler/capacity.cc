#include "scheduler/capacity.h"

#include <algorithm>
#include <limits>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/sparse_row_bytes.h"
#include "handlers/handler.h"

namespace downpour {
namespace {

constexpr uint64_t kMax = std::numeric_limits<uint64_t>::max();

uint64_t SatMul(uint64_t a, uint64_t b) {
  if (a != 0 && b > kMax / a) return kMax;
  return a * b;
}

uint64_t SatAdd(uint64_t a, uint64_t b) { return b > kMax - a ? kMax : a + b; }

// Every server holding `r`: its primary, in-sync and catching-up backups.
template <typename F>
void ForEachHolder(const proto::RangeAssignment& r, F f) {
  if (r.primary() != kNoNode) f(r.primary());
  for (NodeId n : r.replicas()) f(n);
  for (NodeId n : r.catching_up()) f(n);
}

const proto::NodeInfo* FindNode(const proto::ClusterMap& map, NodeId id) {
  for (const proto::NodeInfo& n : map.nodes()) {
    if (n.id() == id) return &n;
  }
  return nullptr;
}

}  // namespace

std::string HumanBytes(uint64_t bytes) {
  if (bytes == kMax) return "over 16 EiB";
  static constexpr const char* kUnits[] = {"B",   "KiB", "MiB", "GiB",
                                           "TiB", "PiB", "EiB"};
  double v = static_cast<double>(bytes);
  int unit = 0;
  while (v >= 1024 && unit < 6) {
    v /= 1024;
    ++unit;
  }
  if (unit == 0) return absl::StrCat(bytes, " B");
  return absl::StrFormat("%.1f %s", v, kUnits[unit]);
}

uint64_t TableRowBytes(const proto::TableSpec& spec) {
  const uint64_t width = spec.width();
  const uint64_t vectors = std::max(1, spec.vectors_size());
  uint64_t state = 0;
  if (!absl::StartsWith(spec.handler().name(), kPluginHandlerPrefix)) {
    auto handler = CreateHandler(spec.handler(), nullptr);
    if (handler.ok()) state = (*handler)->StateWidth(width);
  }
  return SatMul(sizeof(float), SatAdd(SatMul(width, vectors), state));
}

uint64_t RangeBytes(const proto::TableSpec& spec, Key begin, Key end) {
  if (spec.kind() != proto::DENSE || end <= begin) return 0;
  return SatMul(end - begin, TableRowBytes(spec));
}

namespace {
// The bytes of a bounded sparse table's range `r` (0: not bounded by a
// cap).
uint64_t SparseRangeBytes(const proto::TableMap& table,
                          const proto::RangeAssignment& r) {
  const proto::TableSpec& spec = table.spec();
  if (spec.kind() != proto::SPARSE || !spec.has_bounds()) return 0;
  uint64_t state = 0;
  if (!absl::StartsWith(spec.handler().name(), kPluginHandlerPrefix)) {
    auto handler = CreateHandler(spec.handler(), nullptr);
    if (handler.ok()) state = (*handler)->StateWidth(spec.width());
  }
  const uint64_t rows = RangeRowCap(
      static_cast<uint64_t>(std::max<int64_t>(0, spec.bounds().max_rows())),
      static_cast<uint64_t>(std::max<int64_t>(0, spec.bounds().max_bytes())),
      spec.width(), state, r.end() > r.begin() ? r.end() - r.begin() : 0,
      kKeySpaceEnd);
  return SatMul(rows, SparseRowBytes(spec.width(), state));
}
}  // namespace

uint64_t HeldBytes(const proto::TableMap& table,
                   const proto::RangeAssignment& r) {
  if (table.spec().kind() == proto::DENSE) {
    return SatMul(r.end() - r.begin(), TableRowBytes(table.spec()));
  }
  return SparseRangeBytes(table, r);
}

absl::flat_hash_map<NodeId, uint64_t> CommittedBytes(
    const proto::ClusterMap& map) {
  absl::flat_hash_map<NodeId, uint64_t> out;
  for (const proto::TableMap& t : map.tables()) {
    for (const proto::RangeAssignment& r : t.ranges()) {
      const uint64_t bytes = HeldBytes(t, r);
      if (bytes == 0) continue;
      ForEachHolder(r, [&](NodeId n) { out[n] = SatAdd(out[n], bytes); });
    }
  }
  return out;
}

absl::flat_hash_map<NodeId, uint64_t> RoomLeft(const proto::ClusterMap& map) {
  const absl::flat_hash_map<NodeId, uint64_t> committed = CommittedBytes(map);
  absl::flat_hash_map<NodeId, uint64_t> out;
  for (const proto::NodeInfo& n : map.nodes()) {
    if (n.role() != proto::SERVER || n.state() != proto::ALIVE ||
        n.memory_limit_bytes() == 0) {
      continue;
    }
    auto c = committed.find(n.id());
    const uint64_t used = c == committed.end() ? 0 : c->second;
    out[n.id()] =
        used >= n.memory_limit_bytes() ? 0 : n.memory_limit_bytes() - used;
  }
  return out;
}

absl::Status CheckTableFits(const proto::ClusterMap& map,
                            const proto::TableMap& placed) {
  const bool dense = placed.spec().kind() == proto::DENSE;
  const uint64_t row =
      dense ? TableRowBytes(placed.spec())
            : SparseRowBytes(placed.spec().width(), 0);  // for the message
  // Each server's share, in the order servers first appear.
  std::vector<NodeId> order;
  absl::flat_hash_map<NodeId, uint64_t> share;
  for (const proto::RangeAssignment& r : placed.ranges()) {
    const uint64_t bytes = HeldBytes(placed, r);
    if (bytes == 0) continue;
    ForEachHolder(r, [&](NodeId n) {
      if (!share.contains(n)) order.push_back(n);
      share[n] = SatAdd(share[n], bytes);
    });
  }
  const absl::flat_hash_map<NodeId, uint64_t> room = RoomLeft(map);
  for (NodeId n : order) {
    auto left = room.find(n);
    if (left == room.end() || share[n] <= left->second) continue;
    const proto::NodeInfo* node = FindNode(map, n);
    return absl::ResourceExhaustedError(absl::StrCat(
        "table '", placed.spec().name(), "' would need ", HumanBytes(share[n]),
        " (", share[n], " bytes: ", HumanBytes(row), " per row",
        dense ? "" : " and more for handler state, at its row cap",
        ") on server ", n, " ('", node == nullptr ? "" : node->name(),
        "'), which has ", HumanBytes(left->second),
        " left of its table memory limit of ",
        HumanBytes(node == nullptr ? 0 : node->memory_limit_bytes()),
        " (ps_server --max_table_bytes)"));
  }
  return absl::OkStatus();
}

}  // namespace downpour
