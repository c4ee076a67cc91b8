// Primary-backup replication of the key ranges a server holds.
//
// Every range has a primary and zero or more backups (the cluster map's
// RangeAssignment). The primary applies each write, forwards it to every
// backup in the order it applied it, and holds the client's reply until
// every backup has acknowledged it; a backup applies forwarded writes in
// stream order and acknowledges each:
//
//   client --write--> primary --apply--> forward --> backup 1 --apply--> ack
//                        |                  \-----> backup 2 --apply--> ack
//                        +<------ reply once every backup acknowledged ----+
//
// Streams. Each (range, backup) link is an ordered stream of messages
// numbered 1, 2, ... (Replication.stream_seq) under a stream id the primary
// picks. A backup applies only the next message; it acknowledges repeats
// without applying them and refuses gaps, so the primary can resend
// everything not yet acknowledged after any trouble (a backup still behind
// on the map, a lost connection) and the backup ends up having applied each
// message exactly once, in order.
//
// Catch-up. A backup that joins a range (the map lists it as catching_up)
// gets a stream that starts with COPY_BEGIN (the range's ledgers), then the
// rows in chunks (COPY_ROWS) interleaved with the live writes, then
// COPY_END. Since the stream is ordered and a chunk is read from the
// primary's rows when it is sent, the backup applying every write it gets,
// also to rows whose chunk has not come yet (the chunk then overwrites
// them), ends with exactly the primary's range (RangeStore::ImportRows).
// Once COPY_END is acknowledged the primary reports the backup in sync to
// the scheduler (ReplicaReady), which makes it promotable. Until its
// COPY_END is sent, a copying backup holds no client reply: whatever it
// gets before COPY_END is acknowledged with COPY_END, before it can be
// promoted, so writes go on at full speed during a copy (and a copying
// backup that dies stalls nobody).
//
// Failure. An in-sync backup (or one whose COPY_END is sent) that stops
// answering keeps the writes forwarded to it held, so nothing is
// acknowledged that it might lack, until the scheduler
// drops it from the range (a new map): then its outstanding messages count
// as acknowledged. A primary that loses a range (a new map names another)
// answers its held writes with kAborted; the clients retry on the new
// primary, where the range's client ledger (copied with the range) makes a
// retry of an applied write a no-op.
//
// Thread-compatible: the server's data thread owns it, and every callback
// of ReplicationEnv must come back on that thread.
#ifndef DOWNPOUR_SERVER_INTERNAL_REPLICATOR_H_
#define DOWNPOUR_SERVER_INTERNAL_REPLICATOR_H_

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/buffer_pool.h"
#include "common/types.h"
#include "proto/downpour.pb.h"
#include "server/internal/table_shard.h"
#include "transport/frames.h"

namespace downpour {
namespace server_internal {

// What the replicator needs from the server around it. Every method is
// called on the data thread; callbacks must run there too.
class ReplicationEnv {
 public:
  virtual ~ReplicationEnv() = default;
  // Sends `request` to the server at `endpoint`; `done` runs later with its
  // reply header (status OK; the header may carry the peer's error) or the
  // transport's error (then header is null).
  using PeerDone =
      std::function<void(const absl::Status&, const proto::DataHeader*)>;
  virtual void SendToPeer(const std::string& endpoint, OutgoingRequest request,
                          PeerDone done) = 0;
  // Sends a client reply that was deferred.
  virtual void SendDeferred(DeferredReply reply) = 0;
  // The frames of `request` kept past its handler (DataServer::Retain).
  // Called only while that request is being handled.
  virtual std::shared_ptr<const RetainedRequest> Retain(
      const IncomingMessage& request) = 0;
  // Runs `fn` after `delay`.
  virtual void PostAfter(absl::Duration delay, std::function<void()> fn) = 0;
  // Tells the scheduler, without blocking, that `backup` now holds the
  // range of `table` beginning at `range_begin`.
  virtual void ReplicaReady(TableId table, Key range_begin, NodeId backup,
                            Epoch epoch) = 0;
  // Tells the scheduler, without blocking, that this server, in map
  // `epoch`, writes no more to the range of `table` beginning at
  // `range_begin` and that its in-sync backups hold every write it applied:
  // `to` may become its primary (ReplicaReadyRequest.hand_over).
  virtual void HandedOver(TableId table, Key range_begin, NodeId to,
                          Epoch epoch) = 0;
  // Tells the scheduler, without blocking, that `peer` does not answer.
  virtual void ReportUnreachable(NodeId peer, const std::string& why) = 0;
};

// A write applied to a range, to be applied by its backups too. The header
// holds the write as the backups must apply it (op, table, keys or range,
// vector, round and task, client id and sequence, vector command); keys and
// values are spans into `owner`, which keeps them alive. A header whose
// replication kind is set already is sent as that kind: a bounded sparse
// range's EVICT (the keys) or rows brought back from its cold tier
// (COPY_ROWS with their chunk), in stream order before the write.
struct ForwardedWrite {
  TableShard::Range* range = nullptr;
  proto::DataHeader header;
  std::shared_ptr<const void> owner;
  absl::Span<const Key> keys;
  absl::Span<const float> values;
  int64_t step_clock = -1;  // a BSP step: the clock it applied
};

// A backup of a range, as the map names it.
struct BackupInfo {
  NodeId node = kNoNode;
  std::string endpoint;
  uint64_t incarnation = 0;  // a restarted backup is a new one
  bool in_sync = false;      // RangeAssignment.replicas (else catching_up)
};

class Replicator {
 public:
  // `env` must outlive the replicator.
  Replicator(NodeId self, ReplicationEnv* env, size_t copy_chunk_bytes);
  ~Replicator();

  // --- The primary side -------------------------------------------------
  // Sets the backups of `range`, which this server serves as primary in map
  // `epoch`. A backup new to the range gets a stream: a copy first when it
  // is catching up; one already in sync (a range created with backups)
  // starts with the next write. A backup no longer listed is dropped, and
  // what was outstanding on its stream counts as acknowledged.
  // `gated`: the fault-injection gates (set_gates) hold this range's
  // copies and handover.
  void SetBackups(TableId table, TableShard::Range* range,
                  const std::vector<BackupInfo>& backups, Epoch epoch,
                  bool gated = false);
  // This server no longer serves the range beginning at `begin` as primary:
  // its held writes are answered with `why` (kAborted), its streams closed.
  void DropPrimary(TableId table, Key begin, const absl::Status& why);
  // Whether writes to the range must be forwarded.
  bool HasBackups(TableId table, Key begin) const;
  // Map `epoch` was applied to the range beginning at `begin`: if it hands
  // the range to an in-sync backup (Range::handing_to, whose writes the
  // caller refuses), the replicator tells the scheduler (HandedOver) once
  // every in-sync backup acknowledged everything sent to it, once per
  // epoch.
  void HandOver(TableId table, Key begin, Epoch epoch);

  // Holds `replies` (the request's own reply and any BSP waiters it
  // released) until every backup of every range in `writes` acknowledged
  // its part, then sends them. REQUIRES: `writes` non-empty, each range
  // held as primary. `dedup`: the (client, seq) of the write, so that a
  // retry of it arriving meanwhile waits for the same acknowledgements
  // (client 0: none).
  void Hold(std::vector<ForwardedWrite> writes,
            std::vector<DeferredReply> replies, uint64_t client, uint64_t seq);
  // A retry of a write that is still held: `*reply` is moved to be sent
  // with it. False (and `*reply` untouched) if that write is not held.
  bool JoinHeld(TableId table, Key begin, uint64_t client, uint64_t seq,
                DeferredReply* reply);
  // Holds `*reply` (moved) until every backup of the range beginning at
  // `begin` acknowledged everything sent to it so far: for an answer that
  // vouches for an earlier write it did not make itself (a task's ADD
  // dropped as a repeat of one applied before). False (and `*reply`
  // untouched) when nothing is outstanding: answer now.
  bool HoldBehind(TableId table, Key begin, DeferredReply* reply);

  // --- The backup side --------------------------------------------------
  // Whether to apply replication message `r` for the range of `table`
  // beginning at `begin`: true for the next message of the stream (or the
  // first of a new stream), false for a repeat (acknowledge, do not apply);
  // kFailedPrecondition for a gap or an unknown stream. Once the message is
  // applied, Applied(r) moves the stream on.
  absl::StatusOr<bool> Accept(TableId table, Key begin,
                              const proto::Replication& r) const;
  void Applied(TableId table, Key begin, const proto::Replication& r);
  // Forgets the stream position of a range (it was dropped or re-created).
  void ForgetStream(TableId table, Key begin);

  // Fault injection (tests, drills): at most one copy chunk per `delay`
  // per backup, so that a copy lasts long enough to be interrupted.
  void set_copy_delay(absl::Duration delay) { copy_delay_ = delay; }
  // Fault injection (tests): in the ranges SetBackups calls gated, copies
  // send their rows but not their end (COPY_END) while `copy_end` returns
  // false, and a primary does not report its handover while `handover`
  // returns false (each asked on the data thread every 20 ms), so that a
  // test sees a move at either step for as long as it needs, whatever the
  // machine's speed. An empty function is an open gate.
  struct Gates {
    std::function<bool()> copy_end;
    std::function<bool()> handover;
  };
  void set_gates(Gates gates) { gates_ = std::move(gates); }

  // Figures for ServerStats.
  uint64_t forwarded() const { return forwarded_; }
  uint64_t resent() const { return resent_; }
  size_t held_writes() const { return held_.size(); }
  // Catch-up copies finished (COPY_END acknowledged) and rows copied.
  uint64_t copies_done() const { return copies_done_; }
  uint64_t rows_copied() const { return rows_copied_; }

 private:
  struct Held;
  struct Message;
  struct Link;
  struct PrimaryRange;
  using RangeKey = std::pair<TableId, Key>;

  void Send(Link& link, std::shared_ptr<Message> m);
  void Transmit(Link& link, uint64_t seq, const Message& m);
  void OnReply(TableId table, Key begin, NodeId backup, uint64_t stream_id,
               uint64_t seq, const absl::Status& status,
               const proto::DataHeader* header);
  void Acknowledge(Link& link, uint64_t seq);
  void ScheduleResend(TableId table, Key begin, NodeId backup,
                      uint64_t stream_id);
  // Sends copy messages while the link's copy window allows.
  void PumpCopy(PrimaryRange& pr, Link& link);
  // Calls PumpCopy for `link` again `after` from now (once, however often
  // asked meanwhile), unless the link has gone.
  void SchedulePump(PrimaryRange& pr, Link& link, absl::Duration after);
  void Release(uint64_t held_id);
  std::shared_ptr<Message> CopyBegin(const PrimaryRange& pr);
  // Reports a handover of `pr` whose in-sync backups are up to date.
  void CheckHandOver(PrimaryRange& pr);
  // Calls CheckHandOver for `pr` again in 20 ms
  // (once, however often asked meanwhile), unless it is no longer served.
  void ScheduleHandOverCheck(PrimaryRange& pr);

  const NodeId self_;
  ReplicationEnv* const env_;
  const size_t copy_chunk_bytes_;
  absl::Duration copy_delay_ = absl::ZeroDuration();
  Gates gates_;
  absl::flat_hash_map<RangeKey, std::unique_ptr<PrimaryRange>> primaries_;
  // Backup side: (stream id, last applied seq) per range.
  absl::flat_hash_map<RangeKey, std::pair<uint64_t, uint64_t>> streams_;
  std::map<uint64_t, std::unique_ptr<Held>> held_;
  uint64_t next_held_ = 1;
  uint64_t next_stream_id_;
  uint64_t forwarded_ = 0;
  uint64_t resent_ = 0;
  uint64_t copies_done_ = 0;
  uint64_t rows_copied_ = 0;
};

}  // namespace server_internal
}  // namespace downpour

#endif  // DOWNPOUR_SERVER_INTERNAL_REPLICATOR_H_
