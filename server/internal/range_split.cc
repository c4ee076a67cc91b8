#include "server/internal/range_split.h"

#include <algorithm>
#include <cstring>
#include <map>
#include <set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "server/internal/range_ledgers.h"

namespace downpour {
namespace server_internal {

void SliceChunk(const RowChunk& chunk, Key lo, Key hi, size_t width,
                size_t state_width, RowChunk* out) {
  out->keys.clear();
  out->data.clear();
  out->vectors = chunk.vectors;
  out->has_state = chunk.has_state;
  out->kind = chunk.kind;
  // The chunk's rows that go: a run of them for dense chunks, any of them
  // for keyed ones.
  std::vector<size_t> rows;
  if (chunk.keys.empty()) {
    const Key b = std::max(lo, chunk.first_key);
    const Key e = std::min(hi, chunk.first_key + chunk.count);
    for (Key k = b; k < e; ++k) rows.push_back(k - chunk.first_key);
    out->first_key = b;
  } else {
    for (size_t i = 0; i < chunk.keys.size(); ++i) {
      if (chunk.keys[i] >= lo && chunk.keys[i] < hi) {
        rows.push_back(i);
        out->keys.push_back(chunk.keys[i]);
      }
    }
    out->first_key = 0;
  }
  out->count = rows.size();
  // The blocks of the chunk, one after another, each `count` rows of its
  // own width.
  std::vector<size_t> blocks;
  if (chunk.kind == proto::RowChunkInfo::PENDING) {
    blocks.push_back(1);
  } else {
    blocks.push_back(width);
    if (chunk.has_state) blocks.push_back(state_width);
    for (size_t v = 0; v < chunk.vectors.size(); ++v) blocks.push_back(width);
  }
  size_t total = 0;
  for (size_t bw : blocks) total += bw;
  out->data.resize(rows.size() * total);
  const float* src = chunk.data.data();
  float* dst = out->data.data();
  for (size_t bw : blocks) {
    for (size_t r : rows) {
      std::memcpy(dst, src + r * bw, bw * sizeof(float));
      dst += bw;
    }
    src += chunk.count * bw;
  }
}

absl::StatusOr<std::vector<std::unique_ptr<TableShard::Range>>> SplitRange(
    const TableShard& shard, const TableShard::Range& range,
    absl::Span<const Key> cuts) {
  const KeyRange whole = range.range();
  std::vector<KeyRange> spans;
  Key from = whole.begin;
  for (Key cut : cuts) {
    if (cut <= from || cut >= whole.end) {
      return absl::InvalidArgumentError(absl::StrCat(
          "cannot split keys [", whole.begin, ", ", whole.end, ") at key ", cut,
          ": the cuts must ascend inside the range"));
    }
    spans.push_back({from, cut});
    from = cut;
  }
  spans.push_back({from, whole.end});
  proto::RangeLedgers ledgers;
  ExportLedgers(range, &ledgers);
  std::vector<std::unique_ptr<TableShard::Range>> pieces;
  for (const KeyRange& span : spans) {
    std::unique_ptr<TableShard::Range> p = shard.NewRange(span);
    proto::RangeLedgers mine = ledgers;
    mine.clear_steps();
    for (const proto::RangeLedgers::Step& s : ledgers.steps()) {
      const Key b = std::max<Key>(s.begin(), span.begin);
      const Key e = std::min<Key>(s.end(), span.end);
      if (b >= e) continue;
      proto::RangeLedgers::Step* cut = mine.add_steps();
      cut->set_begin(b);
      cut->set_end(e);
      cut->set_next_clock(s.next_clock());
    }
    ImportLedgers(mine, absl::Now(), p.get());
    p->role = range.role;
    p->primary = range.primary;
    p->backups = range.backups;
    pieces.push_back(std::move(p));
  }
  const TableLayout& layout = shard.layout();
  RowChunk chunk, slice;
  std::optional<uint64_t> cursor = 0;
  while (cursor.has_value()) {
    cursor = range.store->ExportRows(*cursor, size_t{4} << 20, &chunk);
    for (size_t i = 0; i < spans.size(); ++i) {
      SliceChunk(chunk, spans[i].begin, spans[i].end, layout.width,
                 layout.state_width, &slice);
      if (slice.count == 0) continue;
      absl::Status s = pieces[i]->store->ImportRows(slice);
      if (!s.ok()) return s;
    }
  }
  return pieces;
}

proto::RangeLedgers JoinLedgers(absl::Span<const proto::RangeLedgers> parts) {
  proto::RangeLedgers out;
  // Per vector, the newest open round and the tasks applied in it.
  std::map<uint32_t,
           std::pair<int64_t, std::set<std::pair<uint64_t, uint64_t>>>>
      rounds;
  struct Writer {
    uint64_t low = 0;
    std::set<uint64_t> seqs;
    std::map<uint64_t, std::vector<double>> scalars;
  };
  std::map<uint64_t, Writer> writers;
  for (const proto::RangeLedgers& p : parts) {
    for (const proto::RangeLedgers::Step& s : p.steps()) *out.add_steps() = s;
    for (const proto::RangeLedgers::Round& r : p.rounds()) {
      auto [it, fresh] = rounds.try_emplace(r.vector());
      if (fresh || r.open() > it->second.first) {
        it->second.first = r.open();
        it->second.second.clear();
      }
      if (r.open() != it->second.first) continue;
      for (int i = 0; i + 1 < r.tasks_size(); i += 2) {
        it->second.second.insert({r.tasks(i), r.tasks(i + 1)});
      }
    }
    for (const proto::RangeLedgers::Writer& w : p.writers()) {
      Writer& j = writers[w.client_id()];
      j.low = std::max(j.low, w.low_seq());
      j.seqs.insert(w.seqs().begin(), w.seqs().end());
      int at = 0;
      for (int i = 0; i < w.scalar_seqs_size() && i < w.scalar_counts_size();
           ++i) {
        const int n = static_cast<int>(w.scalar_counts(i));
        if (at + n > w.scalars_size()) break;
        j.scalars[w.scalar_seqs(i)].assign(w.scalars().begin() + at,
                                           w.scalars().begin() + at + n);
        at += n;
      }
    }
  }
  for (const auto& [vector, round] : rounds) {
    proto::RangeLedgers::Round* r = out.add_rounds();
    r->set_vector(vector);
    r->set_open(round.first);
    for (const auto& [task, key] : round.second) {
      r->add_tasks(task);
      r->add_tasks(key);
    }
  }
  for (const auto& [client, j] : writers) {
    proto::RangeLedgers::Writer* w = out.add_writers();
    w->set_client_id(client);
    w->set_low_seq(j.low);
    for (uint64_t seq : j.seqs) {
      if (seq >= j.low) w->add_seqs(seq);
    }
    for (const auto& [seq, values] : j.scalars) {
      if (seq < j.low) continue;
      w->add_scalar_seqs(seq);
      w->add_scalar_counts(static_cast<uint32_t>(values.size()));
      for (double v : values) w->add_scalars(v);
    }
  }
  return out;
}

absl::StatusOr<std::unique_ptr<TableShard::Range>> MergeRanges(
    const TableShard& shard,
    absl::Span<const TableShard::Range* const> pieces) {
  if (pieces.size() < 2) {
    return absl::InvalidArgumentError("a merge needs two or more ranges");
  }
  for (size_t i = 1; i < pieces.size(); ++i) {
    if (pieces[i]->range().begin != pieces[i - 1]->range().end) {
      return absl::InvalidArgumentError(absl::StrCat(
          "cannot merge keys [", pieces[i - 1]->range().begin, ", ",
          pieces[i - 1]->range().end, ") with [", pieces[i]->range().begin,
          ", ", pieces[i]->range().end, "): they are not neighbours"));
    }
  }
  std::unique_ptr<TableShard::Range> merged = shard.NewRange(
      {pieces.front()->range().begin, pieces.back()->range().end});
  std::vector<proto::RangeLedgers> ledgers(pieces.size());
  for (size_t i = 0; i < pieces.size(); ++i) {
    ExportLedgers(*pieces[i], &ledgers[i]);
  }
  ImportLedgers(JoinLedgers(ledgers), absl::Now(), merged.get());
  merged->role = pieces.front()->role;
  merged->primary = pieces.front()->primary;
  merged->backups = pieces.front()->backups;
  RowChunk chunk;
  for (const TableShard::Range* p : pieces) {
    std::optional<uint64_t> cursor = 0;
    while (cursor.has_value()) {
      cursor = p->store->ExportRows(*cursor, size_t{4} << 20, &chunk);
      if (chunk.count == 0) continue;
      absl::Status s = merged->store->ImportRows(chunk);
      if (!s.ok()) return s;
    }
  }
  return merged;
}

}  // namespace server_internal
}  // namespace downpour
