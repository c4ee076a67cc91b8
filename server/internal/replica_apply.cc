#include "server/internal/replica_apply.h"

#include <algorithm>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "common/status_macros.h"
#include "handlers/vector_kernel.h"

namespace downpour {
namespace server_internal {

absl::Status ApplyReplicated(TableShard& shard, TableShard::Range& range,
                             const IncomingMessage& request) {
  const proto::DataHeader& h = request.header;
  const proto::Replication& r = h.replication();
  const TableLayout& layout = shard.layout();
  const KeyRange kr = range.range();
  switch (r.kind()) {
    case proto::Replication::COPY_BEGIN: {
      // The primary's ledgers; its rows follow. Sparse rows this server
      // holds from an earlier copy may be gone on the primary: start empty.
      if (!layout.dense) {
        range.store = std::make_unique<RangeStore>(&layout, kr);
      }
      const proto::RangeLedgers& l = r.ledgers();
      range.steps.clear();
      for (const proto::RangeLedgers::Step& step : l.steps()) {
        range.StepsFor({step.begin(), step.end()}).Reset(step.next_clock());
      }
      std::vector<RoundLedger::Entry> rounds;
      for (const proto::RangeLedgers::Round& round : l.rounds()) {
        RoundLedger::Entry e{round.vector(), round.open(), {}};
        for (int i = 0; i + 1 < round.tasks_size(); i += 2) {
          e.applied.push_back({round.tasks(i), round.tasks(i + 1)});
        }
        rounds.push_back(std::move(e));
      }
      range.rounds.Import(rounds);
      range.clients.Import(l, absl::Now());
      shard.MergeApplied(l.applied());
      return absl::OkStatus();
    }
    case proto::Replication::COPY_ROWS: {
      RowChunkView c;
      c.first_key = r.chunk().first_key();
      c.count = r.chunk().count();
      c.keys = request.keys;
      c.has_state = r.chunk().has_state();
      c.vectors = absl::MakeConstSpan(r.chunk().vectors().data(),
                                      r.chunk().vectors_size());
      c.data = request.values;
      c.kind = r.chunk().kind();
      return range.store->ImportRows(c);
    }
    case proto::Replication::COPY_END:
      return absl::OkStatus();
    case proto::Replication::EVICT: {
      // The primary's decision: these rows leave memory here too.
      SparseRows* rows = range.store->sparse();
      if (rows == nullptr) {
        return absl::InvalidArgumentError("an eviction on a dense range");
      }
      for (Key k : request.keys) {
        if (!kr.Contains(k)) {
          return absl::InvalidArgumentError(
              absl::StrCat("an eviction of key ", k, " outside its range"));
        }
      }
      return rows->Evict(request.keys);
    }
    case proto::Replication::WRITE:
      break;
    default:
      return absl::InvalidArgumentError(absl::StrCat(
          "unknown replication message kind ", static_cast<int>(r.kind())));
  }
  // A write the primary applied. The primary checked it; these checks only
  // keep a malformed message from touching memory it should not.
  RangeStore& store = *range.store;
  const proto::Op op = h.op();
  if (op == proto::VECTOR) {
    const proto::VectorCommand& cmd = h.vector_command();
    DP_ASSIGN_OR_RETURN(VectorKernel kernel,
                        VectorKernel::Create(cmd, layout.num_vectors));
    std::vector<double> partials(kernel.num_dots(), 0.0);
    const Key lo = std::max<Key>(cmd.begin(), kr.begin);
    const Key hi = std::min<Key>(cmd.end() == 0 ? kr.end : cmd.end(), kr.end);
    store.RunVector(
        lo, hi, kernel,
        cmd.update() != proto::VectorCommand::NONE && cmd.dst() == 0,
        partials.data());
    if (cmd.update() == proto::VectorCommand::ZERO && cmd.open_round() > 0) {
      range.rounds.Open(cmd.dst(), cmd.open_round());
    }
    DP_VLOG(2) << "table " << h.table_id() << " keys [" << kr.begin << ", "
               << kr.end << "): replicated vector command (client "
               << h.client_id() << " seq " << h.seq() << ") "
               << cmd.ShortDebugString();
    if (h.client_id() != 0 && h.seq() != 0) {
      range.clients.Record(h.client_id(), h.seq(), partials, absl::Now());
    }
    return absl::OkStatus();
  }
  if (op != proto::PUT && op != proto::ADD && op != proto::PUSH) {
    return absl::InvalidArgumentError(absl::StrCat(
        "a replicated write with operation ", static_cast<int>(op)));
  }
  if (h.width() != layout.width || h.vector_id() >= layout.num_vectors ||
      (op == proto::PUSH && h.vector_id() != 0)) {
    return absl::InvalidArgumentError("a replicated write of the wrong shape");
  }
  uint64_t n;
  if (h.is_range()) {
    if (h.range_begin() >= h.range_end() || h.range_begin() < kr.begin ||
        h.range_end() > kr.end) {
      return absl::InvalidArgumentError(
          "a replicated range write outside its range");
    }
    n = h.range_end() - h.range_begin();
  } else {
    for (Key k : request.keys) {
      if (!kr.Contains(k)) {
        return absl::InvalidArgumentError(
            absl::StrCat("a replicated write of key ", k, " outside [",
                         kr.begin, ", ", kr.end, ")"));
      }
    }
    n = request.keys.size();
  }
  if (request.values.size() != n * layout.width) {
    return absl::InvalidArgumentError(
        "a replicated write whose values do not match its keys");
  }
  if (h.round() > 0 && n > 0) {
    // The primary applied it as the task's first ADD of the round; a ledger
    // here that disagrees has diverged from the primary's.
    const Key first = h.is_range() ? h.range_begin() : request.keys[0];
    const bool agrees =
        range.rounds.FirstInRound(h.vector_id(), h.round(), h.task_id(), first);
    if (!agrees) {
      DP_LOG(WARNING) << "table " << h.table_id() << " keys [" << kr.begin
                      << ", " << kr.end << "): the primary applied task "
                      << h.task_id() << " of round " << h.round()
                      << " (first key " << first
                      << ") that this replica's ledger holds as applied";
    }
    DP_VLOG(2) << "table " << h.table_id() << " keys [" << kr.begin << ", "
               << kr.end << "): replicated task " << h.task_id() << " of round "
               << h.round() << " (vector " << h.vector_id() << ", first key "
               << first << ", client " << h.client_id() << " seq " << h.seq()
               << ")";
  }
  const float* in = request.values.data();
  const uint32_t vec = h.vector_id();
  const Key b = h.range_begin(), e = h.range_end();
  switch (op) {
    case proto::PUT:
      h.is_range() ? store.PutRange(b, e, in, vec)
                   : store.Put(request.keys, in, vec);
      break;
    case proto::ADD:
      h.is_range() ? store.AddRange(b, e, in, vec)
                   : store.Add(request.keys, in, vec);
      break;
    default:
      h.is_range() ? store.PushRange(b, e, in) : store.Push(request.keys, in);
      break;
  }
  if (h.client_id() != 0 && h.seq() != 0) {
    range.clients.Record(h.client_id(), h.seq(), {}, absl::Now());
  }
  // What the primary's staleness measure took from the write, so that
  // pulls after a failover or handover are measured as they were there.
  if (op == proto::PUSH && h.worker_clock() >= 0 && h.worker_rank() >= 0 &&
      h.worker_rank() < shard.tracked_ranks()) {
    shard.RecordApplied(h.worker_rank(), h.worker_clock());
  }
  if (r.step_clock() >= 0) {
    // The part the primary aggregated: the pushed key range, or a key
    // batch's stretch (the whole range from a primary that named none).
    const KeyRange named{h.range_begin(), h.range_end()};
    const KeyRange part =
        h.is_range() || (named.begin < named.end && named.begin >= kr.begin &&
                         named.end <= kr.end)
            ? named
            : kr;
    range.StepsFor(part).set_next_clock(r.step_clock() + 1);
    for (int rank = 0; rank < shard.tracked_ranks(); ++rank) {
      shard.RecordApplied(rank, r.step_clock());
    }
  }
  return absl::OkStatus();
}

}  // namespace server_internal
}  // namespace downpour
