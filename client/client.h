// The Downpour client SDK: what a training program links to declare tables
// and to push gradients and pull parameters.
//
//   auto client = Client::Connect({.scheduler_address = "127.0.0.1:7070"});
//   TableOptions opts; opts.name = "w"; opts.width = 16; opts.num_keys = 1 <<
//   20; opts.handler = "adagrad"; opts.handler_params = {{"learning_rate",
//   0.1}}; absl::StatusOr<Table> w = (*client)->CreateTable(opts); Ticket t =
//   (*client)->Push(*w, keys, grads);     // asynchronous
//   ... compute ...
//   absl::Status s = (*client)->Wait(t);             // or pass a callback
//   s = (*client)->PullSync(*w, keys, absl::MakeSpan(params));
//
// Operations take a batch of keys (any order, repeats allowed: an add or
// push of a key that appears twice is applied twice, in order, unless the
// table sums repeats: TableOptions::sum_repeats) or a key range. The client
// splits a batch by owning server, sends the parts in parallel (several
// requests in flight per connection) and reassembles replies in the caller's
// key order. A Get or Pull whose keys repeat (at least one in eight of its
// first 2048) asks for each key once and copies its row to the repeats' places:
// ids drawn from a power law repeat a lot, and the bytes and row lookups shrink
// by the batch's repetition factor.
//
// Zero-copy: keys, values and output buffers are referenced, not copied,
// whenever a part is contiguous in the caller's arrays. They must stay alive
// and unchanged until the operation completes (Wait returns or the callback
// runs).
//
// Errors (absl::Status, with the table, keys and server in the message):
//   kNotFound          unknown table
//   kInvalidArgument   a span whose length does not match keys x width
//   kOutOfRange        a key outside the table's key space
//   kResourceExhausted a request larger than the servers take that cannot be
//                      split (a synced sparse batch)
//   kUnavailable       the owning server is dead or unreachable
//   kDeadlineExceeded  no reply within ClientOptions::op_timeout
//   others as the server reports them
// A server answering "not owner" (the map moved) is retried transparently
// with a fresh cluster map.
//
// Thread-safe: any number of threads may share one Client.
#ifndef DOWNPOUR_CLIENT_CLIENT_H_
#define DOWNPOUR_CLIENT_CLIENT_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "common/auth.h"
#include "common/types.h"

namespace downpour {
// Server-side vector algebra (client/vector_op.h, not part of the SDK).
struct VectorRequest;
class VectorOps;

// Longer spins would burn a core for what a sleep costs anyway.
inline constexpr absl::Duration kMaxSpinWait = absl::Milliseconds(10);

struct ClientOptions {
  std::string scheduler_address;  // host:port of ps_scheduler
  // Deadline of each operation, retries included.
  absl::Duration op_timeout = absl::Seconds(30);
  // Parts larger than this are cut into several requests.
  size_t max_message_bytes = size_t{64} << 20;
  // Key batches go in parts of about this many bytes (keys and values),
  // so that the SDK gathers the next part while the last is on the wire
  // and the server applies the one before. 0: cut only at
  // max_message_bytes. Not for AddOnce (its copies must cut their keys
  // alike) nor for a synced sparse push (one part per range).
  size_t part_bytes = size_t{1} << 20;
  absl::Duration connect_timeout = absl::Seconds(30);
  // A Wait for an operation with nothing else of this client in flight
  // first spins up to this long before it sleeps: a thread woken from sleep
  // on an idle core (a halted virtual CPU) starts tens of microseconds
  // later: nearly half of a small pull's round trip on a VM. A spin that runs
  // out makes the next lone waits sleep at once (1, 2, 4, ... up to 64 of
  // them), so a client whose replies take longer burns little. Zero: never
  // spin (many client processes sharing few cores with the servers). At
  // most kMaxSpinWait.
  absl::Duration spin_wait = absl::Microseconds(200);
  // The cluster's security (common/auth.h): with a secret the data plane
  // uses CURVE and scheduler calls carry its token (a client without it is
  // refused with kUnauthenticated); with TLS, scheduler calls run over TLS.
  ClusterAuth auth;
};

// How a table is declared. See proto/downpour.proto (TableSpec) for details.
struct TableOptions {
  std::string name;
  uint32_t width = 1;     // floats per key
  bool sparse = false;    // false: dense keys [0, num_keys)
  uint64_t num_keys = 0;  // dense only
  // Initializer: "zeros", "constant", "uniform" or "normal".
  std::string init = "zeros";
  float init_a = 0;  // constant value; uniform low; normal mean
  float init_b = 0;  // uniform high; normal stddev
  uint64_t init_seed = 0;
  // Update handler applied by Push: "assign", "sum", "sgd", "momentum",
  // "adagrad", "adam", "ftrl" or "plugin:<name>".
  std::string handler = "sgd";
  std::map<std::string, double> handler_params;
  // BSP: pushes are averaged over this many workers per clock before the
  // handler applies them once (0: applied on arrival). Dense tables take
  // key-range pushes; sparse tables key batches, and a clocked Push then
  // sends every server of the table a part, empty ones included, so that
  // each server hears from every worker (one message per server, not cut
  // at max_message_bytes).
  uint32_t sync_workers = 0;
  // Workers (N + backups) whose clocks the servers track for staleness.
  uint32_t tracked_workers = 0;
  // The table enforces the job's consistency policy: the scheduler sets
  // sync_workers and tracked_workers from it (leave both 0; setting them
  // too is kInvalidArgument). What a training program's tables use.
  bool follows_job = false;
  // Named vectors over the same keys (dense tables only), e.g. {"x", "g",
  // "d"}: the first names the parameters. Empty: the parameters alone.
  std::vector<std::string> vectors;
  // Pushes must be finite unless this is set: a gradient holding a NaN or an
  // infinity is refused (kInvalidArgument naming the key) instead of
  // poisoning its row and the handler's state for good.
  bool allow_non_finite = false;
  // A table that follows the job may keep a consistency policy of its own:
  // "bsp", "ssp:N" or "asp" ("": the job's). The hybrid of recommendation
  // models: dense layers under the job's BSP, embedding tables "asp" or
  // "ssp:N". The scheduler enforces it (sync_workers, the staleness bound
  // of JobMember::WaitClock for the table); servers measure each table's
  // staleness. kInvalidArgument without follows_job or for another name.
  std::string consistency;
  // A Push or Add naming a key more than once sums the key's values (in
  // batch order) and applies them once: the gradient of a minibatch, as
  // TorchRec applies it, instead of the handler once per occurrence (the
  // default). The SDK sums before sending, so power-law ids move a
  // fraction of the bytes and handler work. Put, PushPull and AddOnce
  // apply each occurrence as before.
  bool sum_repeats = false;
  // Sparse tables: bounded memory (docs/ARCHITECTURE.md, "Bounded sparse
  // tables"). Absent: rows are created on first write and kept for ever.
  struct Bounds {
    // The table's row cap, split over its ranges by their share of the key
    // space (evenly at first; ids are expected hashed); or a cap in bytes
    // (values, handler state and about 32 bytes of index per row). One of
    // the two, unless only a TTL or admission bounds the table.
    int64_t max_rows = 0;
    int64_t max_bytes = 0;
    // What makes room at the cap: "none" (a write that would create rows
    // beyond it is refused whole, kResourceExhausted), "lru" or "lfu".
    std::string eviction = "none";
    // A row neither read nor written for this many clocks or seconds
    // expires (0: never; one of the two).
    int64_t ttl_clocks = 0;
    int64_t ttl_seconds = 0;
    // An id gets a row once pushed this many times (1: at once); until
    // then its pushes are counted, not stored, and pulls read its initial
    // values. Counters for ids not yet admitted: at most max_pending_ids
    // (0: as many as the cap).
    int64_t admit_after = 1;
    int64_t max_pending_ids = 0;
    // Evicted rows move to the servers' RocksDB (--data_dir) and come
    // back when read or written; without it they are dropped (read as
    // initial values).
    bool cold_tier = false;
  };
  std::optional<Bounds> bounds;
};

// A declared table. Cheap to copy. Operations address its named vector
// `vector` (0: the parameters, which Push updates): see WithVector.
struct Table {
  TableId id = kNoTable;
  std::string name;
  uint32_t width = 0;
  bool sparse = false;
  uint64_t num_keys = 0;             // dense only
  std::vector<std::string> vectors;  // TableOptions::vectors
  uint32_t vector = 0;
  bool allow_non_finite = false;  // TableOptions::allow_non_finite
  bool sum_repeats = false;       // TableOptions::sum_repeats
  // The policy the table enforces ("bsp", "ssp:N", "asp"; "" for a table
  // that does not follow the job) and whether its memory is bounded.
  std::string consistency;
  bool bounded = false;

  // The same table, addressing the named vector `vector_name` (kNotFound if
  // the table has none of that name).
  absl::StatusOr<Table> WithVector(const std::string& vector_name) const;
  // Index of a named vector, or kNotFound.
  absl::StatusOr<uint32_t> VectorIndex(const std::string& vector_name) const;
};

// Bytes this client moved on the data plane (headers, keys and values),
// and how its waits for a lone operation went (ClientOptions::spin_wait).
struct TrafficStats {
  uint64_t requests = 0;
  uint64_t bytes_sent = 0;
  uint64_t bytes_received = 0;
  uint64_t spins = 0;         // waits that spun before sleeping
  uint64_t spins_caught = 0;  // of those, the ones whose reply came in time
};

// Keys of an operation: a batch (implicitly from a span or vector) or a
// half-open range [begin, end).
class Keys {
 public:
  Keys(absl::Span<const Key> batch) : batch_(batch) {}    // NOLINT: implicit
  Keys(const std::vector<Key>& batch) : batch_(batch) {}  // NOLINT: implicit
  static Keys Range(Key begin, Key end) { return Keys(begin, end); }

  bool is_range() const { return is_range_; }
  absl::Span<const Key> batch() const { return batch_; }
  Key begin() const { return begin_; }
  Key end() const { return end_; }
  uint64_t size() const { return is_range_ ? end_ - begin_ : batch_.size(); }

 private:
  Keys(Key begin, Key end) : is_range_(true), begin_(begin), end_(end) {}
  bool is_range_ = false;
  absl::Span<const Key> batch_;
  Key begin_ = 0, end_ = 0;
};

// Identifies an operation in flight.
using Ticket = uint64_t;
// Runs once when an operation completes, on one of the SDK's threads; it
// must not block.
using Callback = std::function<void(const absl::Status&)>;

class Client {
 public:
  // Connects to the scheduler and fetches the cluster map. kUnavailable if
  // the scheduler cannot be reached within connect_timeout. Turns off
  // Abseil's Mutex deadlock detection for the process: Debian's Abseil runs
  // it on every lock, under one global lock. A program that wants it calls
  // absl::SetMutexDeadlockDetectionMode after Connect.
  static absl::StatusOr<std::unique_ptr<Client>> Connect(
      const ClientOptions& options);
  virtual ~Client() = default;

  // Declares a table and waits until every server serves it. Declaring an
  // identical table again returns it; a different one with the same name is
  // kAlreadyExists.
  virtual absl::StatusOr<Table> CreateTable(const TableOptions& options) = 0;
  // A table declared elsewhere. kNotFound if there is none.
  virtual absl::StatusOr<Table> OpenTable(const std::string& name) = 0;

  // Asynchronous operations. Without a callback, Wait(ticket) must be called
  // to learn the outcome (and to release the ticket's bookkeeping); with one,
  // the ticket cannot be waited on.
  //   Put:  values := given     Add: values += given
  //   Push: the table's handler applies the gradients
  //   Get / Pull: read values into `out` (keys.size() * width floats)
  //   PushPull: Push, then read the updated values of the same keys
  virtual Ticket Put(const Table& t, Keys keys, absl::Span<const float> values,
                     Callback done = nullptr) = 0;
  virtual Ticket Add(const Table& t, Keys keys, absl::Span<const float> values,
                     Callback done = nullptr) = 0;
  virtual Ticket Push(const Table& t, Keys keys, absl::Span<const float> grads,
                      Callback done = nullptr) = 0;
  virtual Ticket Get(const Table& t, Keys keys, absl::Span<float> out,
                     Callback done = nullptr) = 0;
  virtual Ticket Pull(const Table& t, Keys keys, absl::Span<float> out,
                      Callback done = nullptr) = 0;
  virtual Ticket PushPull(const Table& t, Keys keys,
                          absl::Span<const float> grads, absl::Span<float> out,
                          Callback done = nullptr) = 0;

  // Exactly-once accumulation for tasks that may run more than once (backup
  // copies, retries after a worker died): an Add into a named vector whose
  // accumulation round `round` (> 0) was opened by a vector command (ZERO
  // with open_round). Each server applies the first Add of `task` in the
  // round and acknowledges, without applying, repeats and Adds of older
  // rounds. REQUIRES for exactness: every copy of a task adds the same keys.
  virtual Ticket AddOnce(const Table& t, Keys keys,
                         absl::Span<const float> values, int64_t round,
                         uint64_t task, Callback done = nullptr) = 0;

  // Blocks until the operation completes or `timeout` passes
  // (kDeadlineExceeded; the operation goes on and may be waited on again).
  // kNotFound for a ticket already waited on or unknown.
  virtual absl::Status Wait(Ticket ticket,
                            absl::Duration timeout = absl::Minutes(5)) = 0;

  // For a caller that waits on a signal of its own for an operation with a
  // callback (Python's Operation.wait does): spins as Wait does before it
  // sleeps (up to ClientOptions::spin_wait, only while at most one
  // operation of this client is in flight) until `done()` is true. Then
  // the caller sleeps on its signal if it must. Returns done().
  virtual bool SpinUntil(absl::FunctionRef<bool()> done) = 0;

  // Synchronous forms: the operation, then Wait.
  absl::Status PutSync(const Table& t, Keys keys, absl::Span<const float> v) {
    return Wait(Put(t, keys, v));
  }
  absl::Status AddSync(const Table& t, Keys keys, absl::Span<const float> v) {
    return Wait(Add(t, keys, v));
  }
  absl::Status PushSync(const Table& t, Keys keys, absl::Span<const float> g) {
    return Wait(Push(t, keys, g));
  }
  absl::Status GetSync(const Table& t, Keys keys, absl::Span<float> out) {
    return Wait(Get(t, keys, out));
  }
  absl::Status PullSync(const Table& t, Keys keys, absl::Span<float> out) {
    return Wait(Pull(t, keys, out));
  }
  absl::Status PushPullSync(const Table& t, Keys keys,
                            absl::Span<const float> g, absl::Span<float> out) {
    return Wait(PushPull(t, keys, g, out));
  }

  // The epoch of the cluster map this client currently routes by.
  virtual Epoch map_epoch() const = 0;

  // Whether every range of `t` is served by a live server in the current
  // map: kUnavailable naming the range and its dead server when nobody
  // holding its data is alive (with replicas the map names a promoted
  // backup at once, so this means a range without a live copy), kDataLoss
  // for a range that was lost, kNotFound for an unknown table. For a long
  // job that waits on others (a coordinator) to fail at once instead of
  // after its timeout.
  virtual absl::Status CheckTable(const Table& t) const = 0;

  // For worker daemons: operations submitted after this carry the worker's
  // rank and clock, which the servers use to aggregate BSP steps and to
  // measure staleness (see consistency/consistency.h). clock < 0: none.
  virtual void SetWorkerClock(int rank, int64_t clock) = 0;
  // The largest staleness the servers reported for this client's pulls.
  virtual int64_t max_staleness() const = 0;
  // Pushes the servers dropped as late (a backup worker's step was taken
  // without it), and AddOnce parts dropped as late or repeated.
  virtual uint64_t discarded_pushes() const = 0;
  // Data-plane traffic of this client so far.
  virtual TrafficStats traffic() const = 0;

 private:
  friend class VectorOps;
  // Starts a vector command (client/vector_op.h); `request` must outlive
  // the operation. Errors as for other operations.
  virtual Ticket SubmitVector(const Table& t, VectorRequest* request) = 0;
};

}  // namespace downpour

#endif  // DOWNPOUR_CLIENT_CLIENT_H_
