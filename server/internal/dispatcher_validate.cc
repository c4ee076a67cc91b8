// Dispatcher, part three: checking a data-plane request before anything
// changes (see dispatcher.h for the error codes).
#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "common/error_reason.h"
#include "common/status_macros.h"
#include "server/internal/dispatcher.h"

namespace downpour {
namespace server_internal {

using Role = TableShard::Range::Role;

namespace {

std::string RangesString(const std::vector<KeyRange>& ranges) {
  if (ranges.empty()) return "none";
  std::string s;
  for (const KeyRange& r : ranges) {
    absl::StrAppend(&s, s.empty() ? "" : " ", "[", r.begin, ", ", r.end, ")");
  }
  return s;
}

// Whether a write of `op` may be retried by its client and is recorded in
// the range's client ledger. Synced (BSP) pushes are idempotent by (rank,
// clock) and task ADDs by (round, task) already.
bool Dedupable(const proto::DataHeader& h, proto::Op op, bool synced) {
  if (h.client_id() == 0 || h.seq() == 0 || synced || h.round() > 0) {
    return false;
  }
  return OpWrites(op) || op == proto::VECTOR;
}

// A request from a map newer than the one this server has applied, which
// it cannot serve yet: the client asks again.
absl::Status Behind(NodeId self, Epoch applied, Epoch request) {
  return WithReason(absl::UnavailableError(absl::StrCat(
                        "server ", self, " has applied epoch ", applied,
                        " but the request is from "
                        "epoch ",
                        request, "; retry")),
                    ErrorReason::kServerBehind);
}

// A write to a range being handed to another server: the client retries
// (with backoff, refreshing its map) until the map names the new primary.
absl::Status HandingOver(const std::string& table,
                         const TableShard::Range& range, Epoch epoch) {
  if (range.handing_to == range.primary) {
    // Handed to itself: the range is being split or merged
    // (RangeAssignment.split_at, .merge).
    return WithReason(
        absl::UnavailableError(absl::StrCat(
            "table '", table, "' keys [", range.range().begin, ", ",
            range.range().end, "): being split or merged (epoch ", epoch,
            "); retry")),
        ErrorReason::kHandingOver);
  }
  return WithReason(
      absl::UnavailableError(absl::StrCat(
          "table '", table, "' keys [", range.range().begin, ", ",
          range.range().end, "): being handed to server ", range.handing_to,
          " (balancing primaries, epoch ", epoch, "); retry")),
      ErrorReason::kHandingOver);
}

// Whether every key lies in `range`: four keys a step, no branch per key.
bool AllIn(absl::Span<const Key> keys, KeyRange range) {
  const Key lo = range.begin, span = range.end - range.begin;
  const Key* k = keys.data();
  const size_t n = keys.size();
  uint64_t outside = 0;
  size_t i = 0;
  for (; i + 4 <= n; i += 4) {
    outside |= static_cast<uint64_t>(k[i] - lo >= span) |
               static_cast<uint64_t>(k[i + 1] - lo >= span) |
               static_cast<uint64_t>(k[i + 2] - lo >= span) |
               static_cast<uint64_t>(k[i + 3] - lo >= span);
  }
  for (; i < n; ++i) outside |= static_cast<uint64_t>(k[i] - lo >= span);
  return outside == 0;
}

}  // namespace

absl::StatusOr<Dispatcher::Validated> Dispatcher::Validate(
    const IncomingMessage& request) const {
  const proto::DataHeader& h = request.header;
  if (h.op() <= proto::OP_UNSPECIFIED || h.op() > proto::VECTOR) {
    return absl::InvalidArgumentError(
        absl::StrCat("unknown operation ", static_cast<int>(h.op())));
  }
  Validated v;
  v.op = h.op();
  Epoch epoch;
  v.shard = Lookup(h.table_id(), &epoch);
  if (v.shard == nullptr) {
    if (h.epoch() > epoch) {
      return Behind(self_, epoch, h.epoch());
    }
    return absl::NotFoundError(
        absl::StrCat("unknown table id ", h.table_id(), " on server ", self_));
  }
  TableShard& shard = *v.shard;
  const proto::TableSpec& spec = shard.spec();
  if (v.op == proto::VECTOR) return ValidateVector(std::move(v), request);
  if (h.vector_id() >= shard.num_vectors()) {
    return absl::InvalidArgumentError(
        absl::StrCat("table '", spec.name(), "' has ", shard.num_vectors(),
                     " vectors; the request names vector ", h.vector_id()));
  }
  if (h.vector_id() != 0 && (v.op == proto::PUSH || v.op == proto::PUSH_PULL)) {
    return absl::InvalidArgumentError(
        absl::StrCat("table '", spec.name(),
                     "': push applies the update handler to the "
                     "parameters (vector 0), not to vector ",
                     h.vector_id()));
  }
  if (h.round() < 0 || (h.round() > 0 && v.op != proto::ADD)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "round ", h.round(), ": only an ADD may carry a round, and it is > 0"));
  }
  v.vector = h.vector_id();
  const size_t width = shard.width();
  if (h.width() != width) {
    return absl::InvalidArgumentError(
        absl::StrCat("table '", spec.name(), "' has width ", width,
                     ", the request says ", h.width()));
  }
  const KeyRange space = shard.key_space();
  auto not_owner = [&](Key key) {
    return WithReason(absl::AbortedError(absl::StrCat(
                          "not owner: server ", self_, " does not own key ",
                          key, " of table '", spec.name(), "' (holds ",
                          RangesString(shard.held()), "), epoch ", epoch)),
                      ErrorReason::kNotOwner);
  };
  auto outside = [&](Key key) {
    return absl::OutOfRangeError(
        absl::StrCat("key ", key, " is outside the key space [0, ", space.end,
                     ") of table '", spec.name(), "'"));
  };
  // A synced key batch to a range with step cuts must say which stretch it
  // speaks for.
  auto unnamed_stretch = [&](const TableShard::Range& r) {
    return absl::InvalidArgumentError(absl::StrCat(
        "table '", spec.name(), "' keys [", r.range().begin, ", ",
        r.range().end,
        ") aggregate BSP steps apart between step cuts: a synced key batch "
        "names its stretch (batch_range_begin/end)"));
  };
  // The range holding `key` if this server serves it as primary.
  auto serving = [&](Key key) -> TableShard::Range* {
    TableShard::Range* r = shard.Find(key);
    return r != nullptr && r->role == Role::kPrimary ? r : nullptr;
  };

  if (h.is_range()) {
    if (!request.keys.empty()) {
      return absl::InvalidArgumentError("a range operation carries no keys");
    }
    if (h.range_begin() >= h.range_end()) {
      return absl::InvalidArgumentError(
          absl::StrCat("empty or inverted range [", h.range_begin(), ", ",
                       h.range_end(), ")"));
    }
    if (h.range_end() > space.end) return outside(h.range_end() - 1);
    v.range = serving(h.range_begin());
    if (v.range == nullptr) return not_owner(h.range_begin());
    if (h.range_end() > v.range->range().end) {
      return not_owner(v.range->range().end);
    }
    v.is_range = true;
    v.begin = h.range_begin();
    v.end = h.range_end();
    v.n = v.end - v.begin;
    if (h.num_keys() != v.n) {
      return absl::InvalidArgumentError(
          absl::StrCat("range [", v.begin, ", ", v.end, ") holds ", v.n,
                       " keys, the header says ", h.num_keys()));
    }
  } else {
    v.keys = request.keys;
    v.n = v.keys.size();
    if (h.num_keys() != v.n) {
      return absl::InvalidArgumentError(
          absl::StrCat("the keys frame holds ", v.n, " keys, the header says ",
                       h.num_keys()));
    }
    if (h.batch_range_end() > 0) {
      // A batch for one named range (a synced sparse push, possibly empty).
      const KeyRange named{h.batch_range_begin(), h.batch_range_end()};
      if (named.begin >= named.end || named.end > space.end) {
        return absl::InvalidArgumentError(
            absl::StrCat("batch names the range [", named.begin, ", ",
                         named.end, ") of table '", spec.name(), "'"));
      }
      // A range, or a stretch of one between its step cuts (a merged
      // range of a table that aggregates BSP steps).
      v.range = shard.FindExact(named);
      if (v.range == nullptr) {
        TableShard::Range* holder = shard.Find(named.begin);
        if (holder != nullptr && holder->IsStretch(named)) v.range = holder;
      }
      if (v.range == nullptr || v.range->role != Role::kPrimary) {
        return not_owner(named.begin);
      }
      // A range with step cuts is pushed a stretch at a time.
      if (!v.range->IsStretch(named)) return unnamed_stretch(*v.range);
      v.stretch = named;
    }
    if (v.range == nullptr && !v.keys.empty() && v.keys[0] < space.end &&
        h.batch_range_end() == 0) {
      v.range = serving(v.keys[0]);
    }
    // The common case without a branch per key: the first key's range
    // (inside the key space) holds them all. Otherwise the loop below
    // finds the first key at fault.
    // The keys a named batch may hold: its stretch.
    auto holds = [&](Key k) {
      return h.batch_range_end() > 0 ? v.stretch.Contains(k)
                                     : v.range->range().Contains(k);
    };
    const bool one_range =
        v.range != nullptr &&
        AllIn(v.keys, h.batch_range_end() > 0 ? v.stretch : v.range->range());
    if (!one_range && h.batch_range_end() == 0) v.range = nullptr;
    for (Key k : one_range ? absl::Span<const Key>() : v.keys) {
      if (k >= space.end) return outside(k);
      if (v.range != nullptr && holds(k)) continue;
      if (h.batch_range_end() > 0) return not_owner(k);
      TableShard::Range* r = serving(k);
      if (r == nullptr) return not_owner(k);
      if (v.range != nullptr) {
        // A client on an older map cut the batch for a range that has been
        // split since: it cuts again on the new map. One on a newer map cut
        // it for a range this server has yet to merge: it asks again.
        if (h.epoch() < epoch) return not_owner(k);
        if (h.epoch() > epoch) return Behind(self_, epoch, h.epoch());
        // Every range is replicated and moved on its own, so one request
        // speaks for one range; the client SDK splits batches that way.
        const KeyRange a = v.range->range(), b = r->range();
        return absl::InvalidArgumentError(absl::StrCat(
            "the keys of one request must lie in one range of table '",
            spec.name(), "': key ", v.keys[0], " is in [", a.begin, ", ", a.end,
            "), key ", k, " in [", b.begin, ", ", b.end, ")"));
      }
      v.range = r;
    }
  }
  if (v.range != nullptr && v.range->lost) {
    // A range is lost on a map newer maps can undo (a restore's ranges are
    // lost until their servers have loaded them): a request from a newer
    // map than this server's is asked again once the server has that map.
    if (h.epoch() > epoch) return Behind(self_, epoch, h.epoch());
    const KeyRange r = v.range->range();
    return absl::DataLossError(absl::StrCat(
        "table '", spec.name(), "' keys [", r.begin, ", ", r.end,
        ") were lost: no live server held them when they were assigned to "
        "server ",
        self_, "; restore the table from a checkpoint"));
  }
  if (h.round() > 0 && v.range != nullptr) {
    DP_RETURN_IF_ERROR(v.range->rounds.Check(v.vector, h.round(), spec.name()));
  }
  // n <= 2^64 and width <= 2^20, so compare in 128 bits.
  const unsigned __int128 floats = static_cast<unsigned __int128>(v.n) * width;
  if (floats * sizeof(float) > max_message_bytes_) {
    return absl::ResourceExhaustedError(absl::StrCat(
        v.n, " keys of width ", width, " exceed the message limit of ",
        max_message_bytes_, " bytes"));
  }
  v.floats = static_cast<size_t>(floats);
  const size_t expected = OpWrites(v.op) ? v.floats : 0;
  if (request.values.size() != expected) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the values frame holds ", request.values.size(), " floats, expected ",
        expected, " (", OpWrites(v.op) ? v.n : 0, " keys x width ", width,
        ") for table '", spec.name(), "'"));
  }
  v.values = request.values.data();
  if ((v.op == proto::PUSH || v.op == proto::PUSH_PULL) &&
      !spec.allow_non_finite()) {
    // A NaN or infinity would poison the row and its handler state (an
    // accumulator keeps it for good): refused, before anything changes.
    const size_t i = FirstNonFinite(request.values);
    if (i < request.values.size()) {
      const size_t row = i / width;
      const Key key = v.is_range ? v.begin + row : v.keys[row];
      return absl::InvalidArgumentError(absl::StrCat(
          "table '", spec.name(), "': the gradient of key ", key, " (column ",
          i % width, ") is ", request.values[i],
          "; pushes must be finite (the table allows non-finite values only "
          "with allow_non_finite)"));
    }
  }

  v.clocked = h.worker_clock() >= 0 && shard.tracked_ranks() > 0;
  if (v.clocked &&
      (h.worker_rank() < 0 || h.worker_rank() >= shard.tracked_ranks())) {
    return absl::InvalidArgumentError(
        absl::StrCat("worker rank ", h.worker_rank(), " outside [0, ",
                     shard.tracked_ranks(), ") of table '", spec.name(), "'"));
  }
  v.synced = v.clocked && spec.sync_workers() > 0 &&
             (v.op == proto::PUSH || v.op == proto::PUSH_PULL);
  if (v.synced && shard.retired(h.worker_rank())) {
    // Counted, it would stand in for a live rank's gradient of the step.
    return absl::FailedPreconditionError(absl::StrCat(
        "table '", spec.name(), "': worker rank ", h.worker_rank(),
        " was retired (the job went on without it, --on_worker_loss="
        "continue); its pushes are refused"));
  }
  // Dense tables aggregate per key range (push, or push-pull answered once
  // the step is applied); sparse tables per key batch, one per worker and
  // range and clock (see TableShard::PushSyncedKeys), push only.
  const bool sparse = spec.kind() == proto::SPARSE;
  if (v.synced &&
      (v.is_range == sparse || (sparse && v.op == proto::PUSH_PULL))) {
    return absl::InvalidArgumentError(
        absl::StrCat("table '", spec.name(), "' aggregates synchronously: ",
                     sparse ? "push key batches, without pull"
                            : "push or push-pull key ranges"));
  }
  if (v.synced && v.range != nullptr) {
    // A clock from the future would hold memory, and, once the step it
    // names completed, make every honest push look late. A worker pushes
    // clock c only once the step before it is applied everywhere it pushed
    // (BSP), so it is never more than one clock ahead of a part.
    if (!v.is_range && v.stretch.end == 0) {
      if (!v.range->step_cuts.empty()) return unnamed_stretch(*v.range);
      v.stretch = v.range->range();
    }
    if (v.is_range && v.range->CrossesCut({v.begin, v.end})) {
      return absl::InvalidArgumentError(absl::StrCat(
          "table '", spec.name(), "': the synced push of keys [", v.begin, ", ",
          v.end,
          ") crosses a step cut of its range (RangeAssignment.step_cuts: "
          "its stretches aggregate apart); cut it there"));
    }
    const KeyRange part = v.is_range ? KeyRange{v.begin, v.end} : v.stretch;
    auto steps = v.range->steps.find({part.begin, part.end});
    if (steps == v.range->steps.end() && h.epoch() > epoch) {
      // A part cut where a newer map split this range (the pieces keep
      // the parts' clocks): asked again once this server has the map.
      return Behind(self_, epoch, h.epoch());
    }
    const Clock next =
        steps == v.range->steps.end() ? 0 : steps->second.next_clock();
    if (h.worker_clock() > next + 1) {
      return absl::FailedPreconditionError(absl::StrCat(
          "table '", spec.name(), "' keys [", part.begin, ", ", part.end,
          "): worker ", h.worker_rank(), " pushed clock ", h.worker_clock(),
          ", but the part is at step ", next,
          "; a worker is never more than one clock ahead under BSP"));
    }
  }
  if (v.synced && !v.is_range && v.range == nullptr) {
    // An empty key batch without a named range: it speaks for the one
    // range this server serves, if there is exactly one.
    TableShard::Range* only = nullptr;
    int serving_count = 0;
    for (const auto& [begin, r] : shard.ranges()) {
      if (r->role == Role::kPrimary) {
        only = r.get();
        ++serving_count;
      }
    }
    if (serving_count != 1) {
      return absl::InvalidArgumentError(
          absl::StrCat("table '", spec.name(),
                       "': an empty synced key batch must name its "
                       "range (batch_range_begin/end); server ",
                       self_, " serves ", serving_count));
    }
    v.range = only;
    if (!only->step_cuts.empty()) return unnamed_stretch(*only);
    v.stretch = only->range();
  }
  if (v.range != nullptr && v.range->backups > 0 && replicator_ == nullptr &&
      OpWrites(v.op)) {
    return absl::FailedPreconditionError(
        absl::StrCat("table '", spec.name(),
                     "': the range has backups, and this server "
                     "was built without replication"));
  }
  if (v.range != nullptr && v.range->handing_to != kNoNode && OpWrites(v.op)) {
    return HandingOver(spec.name(), *v.range, epoch);
  }
  v.deduped = v.range != nullptr && Dedupable(h, v.op, v.synced);
  return v;
}

absl::StatusOr<Dispatcher::Validated> Dispatcher::ValidateVector(
    Validated v, const IncomingMessage& request) const {
  const proto::VectorCommand& cmd = request.header.vector_command();
  const TableShard& shard = *v.shard;
  const std::string& name = shard.spec().name();
  if (!request.keys.empty() || !request.values.empty()) {
    return absl::InvalidArgumentError(
        "a vector command carries no keys and no values");
  }
  if (shard.spec().kind() != proto::DENSE) {
    return absl::InvalidArgumentError(absl::StrCat(
        "table '", name, "' is sparse: vector commands need a dense table"));
  }
  const Key space_end = shard.key_space().end;
  if (cmd.end() != 0 && (cmd.begin() >= cmd.end() || cmd.end() > space_end)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "vector command range [", cmd.begin(), ", ", cmd.end(),
        ") is empty or outside [0, ", space_end, ") of table '", name, "'"));
  }
  DP_ASSIGN_OR_RETURN(VectorKernel kernel,
                      VectorKernel::Create(cmd, shard.num_vectors()), "table '",
                      name, "'");
  v.kernel = std::move(kernel);
  const Key lo = cmd.begin(), hi = cmd.end() == 0 ? space_end : cmd.end();
  int overlapped = 0;
  // Keys [lo, covered) lie in ranges served here as primary (in key order;
  // past a gap, covered stops moving).
  Key covered = lo;
  for (const auto& [begin, r] : shard.ranges()) {
    const KeyRange kr = r->range();
    if (r->role != Role::kPrimary || kr.end <= lo || kr.begin >= hi) continue;
    if (kr.begin <= covered) covered = std::max(covered, kr.end);
    if (r->lost) {
      return absl::DataLossError(absl::StrCat(
          "table '", name, "' keys [", kr.begin, ", ", kr.end,
          ") were lost: no live server held them when they were assigned to "
          "server ",
          self_, "; restore the table from a checkpoint"));
    }
    if (r->backups > 0 && replicator_ == nullptr) {
      return absl::FailedPreconditionError(
          absl::StrCat("table '", name,
                       "': the range has backups, and this server was "
                       "built without replication"));
    }
    if (r->handing_to != kNoNode) return HandingOver(name, *r, epoch());
    v.range = r.get();
    ++overlapped;
  }
  if (covered < hi) {
    // A part of the command this server does not serve as primary (not
    // yet: it has not applied the map that promotes it; or no longer).
    // Answered OK, that part would count as done with nothing applied and
    // no dot products: a Sandblaster retry after a failover once reached
    // the promoted backup just before its promotion and was lost so
    // (tests/sandblaster_failover_test.cc ended 7e-4 off its reference).
    const Epoch applied = epoch();
    if (request.header.epoch() > applied) {
      return WithReason(absl::UnavailableError(absl::StrCat(
                            "server ", self_, " has applied epoch ", applied,
                            " but the vector command is from epoch ",
                            request.header.epoch(), "; retry")),
                        ErrorReason::kServerBehind);
    }
    return WithReason(absl::AbortedError(absl::StrCat(
                          "not owner: server ", self_, " does not serve key ",
                          covered, " of table '", name, "' as primary (holds ",
                          RangesString(shard.held()), "), epoch ", applied)),
                      ErrorReason::kNotOwner);
  }
  // A command for one range (as the SDK sends them) is recorded in that
  // range's client ledger; one spanning several is not retried safely.
  if (overlapped != 1) v.range = nullptr;
  v.deduped = v.range != nullptr && Dedupable(request.header, v.op, false);
  return v;
}

}  // namespace server_internal
}  // namespace downpour
