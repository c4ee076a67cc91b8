#include "server/internal/replicator.h"

#include <algorithm>
#include <random>

#include "absl/strings/str_cat.h"
#include "common/logging.h"

namespace downpour {
namespace server_internal {
namespace {

// Copy chunks in flight per link before the primary waits for
// acknowledgements: enough to keep the link busy, little enough that live
// writes queued behind them are not delayed long.
constexpr int kCopyChunksInFlight = 4;

absl::Duration ResendDelay(int attempt) {
  return std::min(absl::Milliseconds(20) * (1 << std::min(attempt, 6)),
                  absl::Seconds(1));
}

}  // namespace

// A message of a stream, shared by its resends.
struct Replicator::Message {
  proto::DataHeader header;  // stream_seq and stream_id are set per send
  std::shared_ptr<const void> owner;
  absl::Span<const Key> keys;
  absl::Span<const float> values;
  size_t copy_bytes = 0;  // COPY_ROWS: bytes counted against the window
  bool copy_end = false;
};

// One backup of one range: an ordered stream and what is unacknowledged.
struct Replicator::Link {
  NodeId backup = kNoNode;
  std::string endpoint;
  uint64_t incarnation = 0;
  uint64_t stream_id = 0;
  uint64_t next_seq = 1;
  struct Pending {
    uint64_t seq;
    std::shared_ptr<Message> message;
    std::vector<uint64_t> held;  // Held ids waiting for this message
  };
  std::deque<Pending> unacked;
  // Catch-up: rows still to send (cursor), chunks in flight.
  bool copying = false;
  bool rows_done = false;
  bool copy_end_sent = false;
  uint64_t cursor = 0;
  int chunks_in_flight = 0;
  Epoch copy_epoch = 0;
  // Paced copies (set_copy_delay): when the next chunk may go, and
  // whether a pump is scheduled for then.
  absl::Time next_chunk_at = absl::InfinitePast();
  bool pump_scheduled = false;
  // Trouble: a resend is scheduled; attempts since the last progress.
  bool resend_scheduled = false;
  int attempt = 0;
  bool reported = false;
};

struct Replicator::PrimaryRange {
  TableId table = kNoTable;
  TableShard::Range* range = nullptr;
  std::map<NodeId, std::unique_ptr<Link>> links;
  // (client, seq) -> Held id, for retries of writes still held.
  absl::flat_hash_map<std::pair<uint64_t, uint64_t>, uint64_t> dedup;
  // The map a handover (range->handing_to) was last reported from, or is
  // to be.
  Epoch handover_epoch = 0;
  bool handover_reported = false;
  // Fault injection: the gates hold this range (SetBackups), and a held
  // handover's next check is scheduled.
  bool gated = false;
  bool handover_check_scheduled = false;
};

// Replies waiting for acknowledgements.
struct Replicator::Held {
  std::vector<DeferredReply> replies;
  int outstanding = 0;
  // Where its dedup entries are, to erase them on release.
  std::vector<std::pair<RangeKey, std::pair<uint64_t, uint64_t>>> dedup;
};

Replicator::Replicator(NodeId self, ReplicationEnv* env,
                       size_t copy_chunk_bytes)
    : self_(self), env_(env), copy_chunk_bytes_(copy_chunk_bytes) {
  // Stream ids differ between incarnations of this server, so that a backup
  // never mistakes a new stream for the continuation of an old one.
  std::random_device rd;
  next_stream_id_ = (static_cast<uint64_t>(rd()) << 32 | rd()) | 1;
}

Replicator::~Replicator() = default;

bool Replicator::HasBackups(TableId table, Key begin) const {
  auto it = primaries_.find({table, begin});
  return it != primaries_.end() && !it->second->links.empty();
}

void Replicator::HandOver(TableId table, Key begin, Epoch epoch) {
  auto it = primaries_.find({table, begin});
  if (it == primaries_.end()) return;
  PrimaryRange& pr = *it->second;
  if (pr.handover_epoch != epoch) {
    pr.handover_epoch = epoch;
    pr.handover_reported = false;
  }
  CheckHandOver(pr);
}

void Replicator::CheckHandOver(PrimaryRange& pr) {
  const NodeId to = pr.range->handing_to;
  if (to == kNoNode || pr.handover_reported) return;
  // Catching-up backups start over from the new primary; writes still held
  // for them are answered kAborted when this server lets the range go, and
  // their retries are found in the new primary's client ledger.
  for (const auto& [node, link] : pr.links) {
    if (!link->copying && !link->unacked.empty()) return;
  }
  if (pr.gated && gates_.handover && !gates_.handover()) {
    ScheduleHandOverCheck(pr);
    return;
  }
  pr.handover_reported = true;
  DP_LOG(INFO) << "table " << pr.table << " keys [" << pr.range->range().begin
               << ", " << pr.range->range().end << "): ready to hand to " << to
               << " (epoch " << pr.handover_epoch << ")";
  env_->HandedOver(pr.table, pr.range->range().begin, to, pr.handover_epoch);
}

void Replicator::ScheduleHandOverCheck(PrimaryRange& pr) {
  if (pr.handover_check_scheduled) return;
  pr.handover_check_scheduled = true;
  const RangeKey key{pr.table, pr.range->range().begin};
  // Polled: the gate is a test's file, not an event of this thread.
  env_->PostAfter(absl::Milliseconds(20), [this, key] {
    auto p = primaries_.find(key);
    if (p == primaries_.end()) return;
    p->second->handover_check_scheduled = false;
    CheckHandOver(*p->second);
  });
}

void Replicator::SetBackups(TableId table, TableShard::Range* range,
                            const std::vector<BackupInfo>& backups, Epoch epoch,
                            bool gated) {
  const RangeKey key{table, range->range().begin};
  std::unique_ptr<PrimaryRange>& slot = primaries_[key];
  if (slot == nullptr) {
    slot = std::make_unique<PrimaryRange>();
    slot->table = table;
  }
  PrimaryRange& pr = *slot;
  pr.range = range;
  pr.gated = gated;
  // Backups no longer listed: what they owe counts as acknowledged.
  for (auto it = pr.links.begin(); it != pr.links.end();) {
    const bool listed =
        std::any_of(backups.begin(), backups.end(), [&](const BackupInfo& b) {
          return b.node == it->first &&
                 b.incarnation == it->second->incarnation;
        });
    if (listed) {
      ++it;
      continue;
    }
    DP_LOG(INFO) << "table " << table << " keys [" << range->range().begin
                 << ", " << range->range().end << "): backup " << it->first
                 << " dropped from the range";
    std::deque<Link::Pending> owed = std::move(it->second->unacked);
    it = pr.links.erase(it);
    for (Link::Pending& p : owed) {
      for (uint64_t h : p.held) {
        auto held = held_.find(h);
        if (held != held_.end() && --held->second->outstanding == 0) {
          Release(h);
        }
      }
    }
  }
  for (const BackupInfo& b : backups) {
    if (pr.links.count(b.node)) continue;
    auto link = std::make_unique<Link>();
    link->backup = b.node;
    link->endpoint = b.endpoint;
    link->incarnation = b.incarnation;
    link->stream_id = next_stream_id_++;
    link->copying = !b.in_sync;
    link->copy_epoch = epoch;
    Link& l = *link;
    pr.links[b.node] = std::move(link);
    if (l.copying) {
      DP_LOG(INFO) << "table " << table << " keys [" << range->range().begin
                   << ", " << range->range().end << "): copying to backup "
                   << b.node << " (" << b.endpoint << ")";
      Send(l, CopyBegin(pr));
      PumpCopy(pr, l);
    }
  }
}

void Replicator::DropPrimary(TableId table, Key begin,
                             const absl::Status& why) {
  auto it = primaries_.find({table, begin});
  if (it == primaries_.end()) return;
  std::unique_ptr<PrimaryRange> pr = std::move(it->second);
  primaries_.erase(it);
  for (auto& [node, link] : pr->links) {
    for (Link::Pending& p : link->unacked) {
      for (uint64_t h : p.held) {
        auto held = held_.find(h);
        if (held == held_.end()) continue;
        // Not known to be on every backup: the client must retry where the
        // range is now (a retry of an applied write is recognised there).
        for (DeferredReply& r : held->second->replies) {
          SetReplyStatus(why, &r.reply.header);
          r.reply.values = Payload();
        }
        held->second->outstanding = 0;
        Release(h);
      }
    }
  }
}

void Replicator::Hold(std::vector<ForwardedWrite> writes,
                      std::vector<DeferredReply> replies, uint64_t client,
                      uint64_t seq) {
  const uint64_t id = next_held_++;
  auto held = std::make_unique<Held>();
  held->replies = std::move(replies);
  Held& h = *held;
  held_[id] = std::move(held);
  for (ForwardedWrite& w : writes) {
    const RangeKey key{w.header.table_id(), w.range->range().begin};
    auto it = primaries_.find(key);
    if (it == primaries_.end()) continue;
    PrimaryRange& pr = *it->second;
    if (client != 0) {
      pr.dedup[{client, seq}] = id;
      h.dedup.push_back({key, {client, seq}});
    }
    auto m = std::make_shared<Message>();
    m->header = std::move(w.header);
    proto::Replication* r = m->header.mutable_replication();
    if (r->kind() == proto::Replication::NONE) {
      r->set_kind(proto::Replication::WRITE);
    }
    r->set_range_begin(w.range->range().begin);
    r->set_range_end(w.range->range().end);
    r->set_step_clock(w.step_clock);
    m->owner = std::move(w.owner);
    m->keys = w.keys;
    m->values = w.values;
    for (auto& [node, link] : pr.links) {
      Send(*link, m);
      ++forwarded_;
      // A backup still copying the range, before its COPY_END, holds
      // nothing promotable: the write reaches it in stream order before
      // the COPY_END whose acknowledgement makes it in sync, so the reply
      // need not wait for it (a move's copy does not stall writes).
      if (link->copying && !link->copy_end_sent) continue;
      ++h.outstanding;
      link->unacked.back().held.push_back(id);
    }
  }
  if (h.outstanding == 0) {
    // The request being handled is not deferred until its handler returns:
    // release from the data thread's next turn.
    env_->PostAfter(absl::ZeroDuration(), [this, id] { Release(id); });
  }
}

bool Replicator::JoinHeld(TableId table, Key begin, uint64_t client,
                          uint64_t seq, DeferredReply* reply) {
  auto pr = primaries_.find({table, begin});
  if (pr == primaries_.end()) return false;
  auto d = pr->second->dedup.find({client, seq});
  if (d == pr->second->dedup.end()) return false;
  auto held = held_.find(d->second);
  if (held == held_.end()) return false;
  held->second->replies.push_back(std::move(*reply));
  return true;
}

bool Replicator::HoldBehind(TableId table, Key begin, DeferredReply* reply) {
  auto pr = primaries_.find({table, begin});
  if (pr == primaries_.end()) return false;
  // The links Hold waits on, with something unacknowledged: in stream
  // order, their last message is acknowledged after every earlier one.
  std::vector<Link*> waiting;
  for (auto& [node, link] : pr->second->links) {
    if (link->copying && !link->copy_end_sent) continue;
    if (!link->unacked.empty()) waiting.push_back(link.get());
  }
  if (waiting.empty()) return false;
  const uint64_t id = next_held_++;
  auto held = std::make_unique<Held>();
  held->replies.push_back(std::move(*reply));
  held->outstanding = static_cast<int>(waiting.size());
  held_[id] = std::move(held);
  for (Link* link : waiting) link->unacked.back().held.push_back(id);
  return true;
}

void Replicator::Release(uint64_t held_id) {
  auto it = held_.find(held_id);
  if (it == held_.end()) return;
  std::unique_ptr<Held> h = std::move(it->second);
  held_.erase(it);
  for (const auto& [key, cs] : h->dedup) {
    auto pr = primaries_.find(key);
    if (pr == primaries_.end()) continue;
    auto d = pr->second->dedup.find(cs);
    if (d != pr->second->dedup.end() && d->second == held_id) {
      pr->second->dedup.erase(d);
    }
  }
  for (DeferredReply& r : h->replies) env_->SendDeferred(std::move(r));
}

void Replicator::Send(Link& link, std::shared_ptr<Message> m) {
  link.unacked.push_back({link.next_seq++, std::move(m), {}});
  // Behind a failed message the backup refuses everything (a gap): send
  // only once the scheduled resend has gone out.
  if (!link.resend_scheduled) {
    Transmit(link, link.unacked.back().seq, *link.unacked.back().message);
  }
}

void Replicator::Transmit(Link& link, uint64_t seq, const Message& m) {
  OutgoingRequest req;
  req.header = m.header;
  req.header.set_sender(self_);
  proto::Replication* r = req.header.mutable_replication();
  r->set_stream_id(link.stream_id);
  r->set_stream_seq(seq);
  auto owner = m.owner;
  if (!m.keys.empty()) {
    req.keys =
        Payload::Borrow(m.keys.data(), m.keys.size() * sizeof(Key), [owner] {});
  }
  if (!m.values.empty()) {
    req.values = Payload::Borrow(m.values.data(),
                                 m.values.size() * sizeof(float), [owner] {});
  }
  const TableId table = m.header.table_id();
  const Key begin = r->range_begin();
  const NodeId backup = link.backup;
  const uint64_t stream = link.stream_id;
  env_->SendToPeer(link.endpoint, std::move(req),
                   [this, table, begin, backup, stream, seq](
                       const absl::Status& s, const proto::DataHeader* h) {
                     OnReply(table, begin, backup, stream, seq, s, h);
                   });
}

void Replicator::OnReply(TableId table, Key begin, NodeId backup,
                         uint64_t stream_id, uint64_t seq,
                         const absl::Status& status,
                         const proto::DataHeader* header) {
  auto pr = primaries_.find({table, begin});
  if (pr == primaries_.end()) return;
  auto l = pr->second->links.find(backup);
  if (l == pr->second->links.end() || l->second->stream_id != stream_id) {
    return;  // a stream since closed
  }
  Link& link = *l->second;
  absl::Status s = status;
  if (s.ok()) s = ReplyStatus(*header);
  if (s.ok()) {
    link.attempt = 0;
    link.reported = false;
    Acknowledge(link, seq);
    if (link.copying) PumpCopy(*pr->second, link);
    CheckHandOver(*pr->second);
    return;
  }
  // A backup behind on the map, a gap after a lost message, a broken
  // connection: send everything unacknowledged again, in order, a little
  // later. The scheduler decides whether the backup is gone.
  if (!status.ok() && !link.reported) {
    link.reported = true;
    env_->ReportUnreachable(backup, std::string(status.message()));
  }
  if (link.attempt == 0 || link.attempt % 16 == 0) {
    DP_LOG(WARNING) << "table " << table << " range from key " << begin
                    << ": backup " << backup << " did not take message " << seq
                    << ": " << s << "; resending";
  }
  ScheduleResend(table, begin, backup, stream_id);
}

void Replicator::Acknowledge(Link& link, uint64_t seq) {
  std::vector<uint64_t> done;
  while (!link.unacked.empty() && link.unacked.front().seq <= seq) {
    Link::Pending& p = link.unacked.front();
    if (p.message->copy_bytes > 0) --link.chunks_in_flight;
    if (p.message->copy_end) {
      link.copying = false;
      ++copies_done_;
      const proto::Replication& r = p.message->header.replication();
      DP_LOG(INFO) << "table " << p.message->header.table_id() << " keys ["
                   << r.range_begin() << ", " << r.range_end() << "): backup "
                   << link.backup << " holds the range";
      env_->ReplicaReady(p.message->header.table_id(), r.range_begin(),
                         link.backup, link.copy_epoch);
    }
    done.insert(done.end(), p.held.begin(), p.held.end());
    link.unacked.pop_front();
  }
  for (uint64_t h : done) {
    auto held = held_.find(h);
    if (held != held_.end() && --held->second->outstanding == 0) Release(h);
  }
}

void Replicator::ScheduleResend(TableId table, Key begin, NodeId backup,
                                uint64_t stream_id) {
  auto pr = primaries_.find({table, begin});
  if (pr == primaries_.end()) return;
  auto l = pr->second->links.find(backup);
  if (l == pr->second->links.end()) return;
  Link& link = *l->second;
  if (link.resend_scheduled) return;
  link.resend_scheduled = true;
  env_->PostAfter(ResendDelay(link.attempt++), [=] {
    auto pr = primaries_.find({table, begin});
    if (pr == primaries_.end()) return;
    auto l = pr->second->links.find(backup);
    if (l == pr->second->links.end() || l->second->stream_id != stream_id) {
      return;
    }
    Link& link = *l->second;
    link.resend_scheduled = false;
    for (const Link::Pending& p : link.unacked) {
      ++resent_;
      Transmit(link, p.seq, *p.message);
    }
  });
}

std::shared_ptr<Replicator::Message> Replicator::CopyBegin(
    const PrimaryRange& pr) {
  auto m = std::make_shared<Message>();
  m->header.set_table_id(pr.table);
  proto::Replication* r = m->header.mutable_replication();
  r->set_kind(proto::Replication::COPY_BEGIN);
  r->set_range_begin(pr.range->range().begin);
  r->set_range_end(pr.range->range().end);
  proto::RangeLedgers* ledgers = r->mutable_ledgers();
  for (const auto& [part, steps] : pr.range->steps) {
    proto::RangeLedgers::Step* step = ledgers->add_steps();
    step->set_begin(part.first);
    step->set_end(part.second);
    step->set_next_clock(steps.next_clock());
  }
  for (const RoundLedger::Entry& e : pr.range->rounds.Export()) {
    proto::RangeLedgers::Round* round = ledgers->add_rounds();
    round->set_vector(e.vector);
    round->set_open(e.open);
    for (const auto& [task, key] : e.applied) {
      round->add_tasks(task);
      round->add_tasks(key);
    }
  }
  pr.range->clients.Export(ledgers);
  if (pr.range->shard != nullptr) {
    for (Clock c : pr.range->shard->AppliedCounts()) ledgers->add_applied(c);
  }
  return m;
}

void Replicator::SchedulePump(PrimaryRange& pr, Link& link,
                              absl::Duration after) {
  if (link.pump_scheduled) return;
  link.pump_scheduled = true;
  const RangeKey key{pr.table, pr.range->range().begin};
  const NodeId backup = link.backup;
  const uint64_t stream = link.stream_id;
  env_->PostAfter(after, [this, key, backup, stream] {
    auto p = primaries_.find(key);
    if (p == primaries_.end()) return;
    auto l = p->second->links.find(backup);
    if (l == p->second->links.end() || l->second->stream_id != stream) {
      return;
    }
    l->second->pump_scheduled = false;
    PumpCopy(*p->second, *l->second);
  });
}

void Replicator::PumpCopy(PrimaryRange& pr, Link& link) {
  while (link.copying && link.chunks_in_flight < kCopyChunksInFlight &&
         !link.resend_scheduled) {
    if (link.copy_end_sent) return;  // waiting for its acknowledgement
    if (copy_delay_ > absl::ZeroDuration()) {
      const absl::Time now = absl::Now();
      if (now < link.next_chunk_at) {
        SchedulePump(pr, link, link.next_chunk_at - now);
        return;
      }
      link.next_chunk_at = now + copy_delay_;
    }
    if (link.rows_done) {
      if (pr.gated && gates_.copy_end && !gates_.copy_end()) {
        // Polled: the gate is a test's file, not an event of this thread.
        SchedulePump(pr, link, absl::Milliseconds(20));
        return;
      }
      link.copy_end_sent = true;
      auto m = std::make_shared<Message>();
      m->header.set_table_id(pr.table);
      proto::Replication* r = m->header.mutable_replication();
      r->set_kind(proto::Replication::COPY_END);
      r->set_range_begin(pr.range->range().begin);
      r->set_range_end(pr.range->range().end);
      m->copy_end = true;
      Send(link, std::move(m));
      return;
    }
    auto chunk = std::make_shared<RowChunk>();
    std::optional<uint64_t> next = pr.range->store->ExportRows(
        link.cursor, copy_chunk_bytes_, chunk.get());
    link.rows_done = !next.has_value();
    if (next) link.cursor = *next;
    auto m = std::make_shared<Message>();
    m->header.set_table_id(pr.table);
    proto::Replication* r = m->header.mutable_replication();
    r->set_kind(proto::Replication::COPY_ROWS);
    r->set_range_begin(pr.range->range().begin);
    r->set_range_end(pr.range->range().end);
    proto::RowChunkInfo* info = r->mutable_chunk();
    info->set_first_key(chunk->first_key);
    info->set_count(chunk->count);
    info->set_has_state(chunk->has_state);
    info->set_kind(chunk->kind);  // rows, admission counters or cold rows
    for (uint32_t v : chunk->vectors) info->add_vectors(v);
    m->keys = chunk->keys;
    m->values = chunk->data;
    m->copy_bytes = std::max<size_t>(1, chunk->data.size() * sizeof(float));
    rows_copied_ += chunk->count;
    m->owner = std::move(chunk);
    ++link.chunks_in_flight;
    Send(link, std::move(m));
  }
}

absl::StatusOr<bool> Replicator::Accept(TableId table, Key begin,
                                        const proto::Replication& r) const {
  auto it = streams_.find({table, begin});
  const bool known = it != streams_.end() && it->second.first == r.stream_id();
  if (!known) {
    if (r.stream_seq() == 1) return true;  // a new stream
    return absl::FailedPreconditionError(absl::StrCat(
        "replication stream ", r.stream_id(), " is not the one this backup ",
        "follows for the range from key ", begin, " (message ", r.stream_seq(),
        "); a new stream starts at 1"));
  }
  const uint64_t last = it->second.second;
  if (r.stream_seq() <= last) return false;  // a resend of what it applied
  if (r.stream_seq() != last + 1) {
    return absl::FailedPreconditionError(
        absl::StrCat("replication gap: message ", r.stream_seq(), " after ",
                     last, " for the range from key ", begin));
  }
  return true;
}

void Replicator::Applied(TableId table, Key begin,
                         const proto::Replication& r) {
  streams_[{table, begin}] = {r.stream_id(), r.stream_seq()};
}

void Replicator::ForgetStream(TableId table, Key begin) {
  streams_.erase({table, begin});
}

}  // namespace server_internal
}  // namespace downpour
