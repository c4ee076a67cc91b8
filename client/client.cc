#include "client/client.h"

#include <sched.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <deque>
#include <limits>
#include <map>
#include <random>
#include <thread>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "client/internal/first_seen.h"
#include "client/internal/open_writes.h"
#include "client/internal/row_ops.h"
#include "client/internal/spin_backoff.h"
#include "client/internal/sum_repeats.h"
#include "client/internal/vector_request.h"
#include "client/split_by_owner.h"
#include "cluster/cluster_map.h"
#include "cluster/scheduler_client.h"
#include "common/buffer_pool.h"
#include "common/error_reason.h"
#include "common/logging.h"
#include "common/serial_executor.h"
#include "common/status_macros.h"
#include "proto/downpour.pb.h"
#include "transport/data_client.h"

namespace downpour {
namespace {

uint64_t RandomId() {
  std::random_device rd;
  return (static_cast<uint64_t>(rd()) << 32 | rd()) | 1;
}

const char* OpName(proto::Op op) {
  switch (op) {
    case proto::PUT:
      return "put";
    case proto::GET:
      return "get";
    case proto::ADD:
      return "add";
    case proto::PUSH:
      return "push";
    case proto::PULL:
      return "pull";
    case proto::PUSH_PULL:
      return "push-pull";
    case proto::VECTOR:
      return "vector command";
    default:
      return "unknown op";
  }
}

// Runs an operation's callback: at once on the SDK's threads; from a thread
// that pumps the transport inside Wait (a caller's), later on the retry
// thread, so that callbacks run on the SDK's threads only.
void RunCallback(Callback callback, const absl::Status& status);

// One operation as the caller issued it. Completes when every part has been
// answered and every borrowed buffer released by the transport.
struct OpState {
  proto::Op op;
  Table table;
  Keys keys;
  const float* in;
  float* out;
  absl::Time deadline;
  Callback callback;
  int rank = 0;
  int64_t clock = -1;
  int64_t round = 0;  // AddOnce
  uint64_t task = 0;
  VectorRequest* vector = nullptr;  // VECTOR: the command, the partials

  // A read that folds its repeated keys: the position of each key's first
  // occurrence (uint32_t per key of the batch); the rows of the others are
  // copied from there once every part is in. Written by the first routing,
  // before the submitter's hold is released.
  Buffer first_seen;
  // A write to a table that sums repeats: the batch's distinct keys and
  // their summed rows, which `keys` and `in` then point into (set by the
  // first routing, before any part is sent; parts and retries address
  // positions in them).
  Buffer summed_keys, summed_values;

  std::atomic<int> outstanding{1};  // 1 held by the submitter until all sent
  // The client's count of operations not yet complete, this one among them.
  std::shared_ptr<std::atomic<int>> running;
  // With a callback: the client's count of those not yet complete.
  std::shared_ptr<std::atomic<int>> with_callback;
  absl::Mutex mu;
  absl::Status status ABSL_GUARDED_BY(mu);
  absl::Notification done;

  OpState(proto::Op o, const Table& t, Keys k, const float* i, float* ou,
          absl::Time d, Callback cb)
      : op(o),
        table(t),
        keys(k),
        in(i),
        out(ou),
        deadline(d),
        callback(std::move(cb)) {}

  void Fail(const absl::Status& s) {
    absl::MutexLock lock(&mu);
    if (status.ok()) status = s;
  }
  bool failed() {
    absl::MutexLock lock(&mu);
    return !status.ok();
  }
  void Hold() { outstanding.fetch_add(1, std::memory_order_relaxed); }
  void Release() {
    if (outstanding.fetch_sub(1, std::memory_order_acq_rel) != 1) return;
    absl::Status s;
    {
      absl::MutexLock lock(&mu);
      s = status;
    }
    if (s.ok() && first_seen.size() > 0) CopyRepeats();
    if (running) running->fetch_sub(1, std::memory_order_relaxed);
    if (with_callback) with_callback->fetch_sub(1, std::memory_order_relaxed);
    if (callback) {
      RunCallback(std::move(callback), s);
    } else {
      done.Notify();
    }
  }
  void CopyRepeats() {
    const auto* first = reinterpret_cast<const uint32_t*>(first_seen.data());
    const size_t n = first_seen.size() / sizeof(uint32_t);
    const size_t width = table.width;
    WithFixedWidth(width, [&](auto fixed) {
      for (size_t i = 0; i < n; ++i) {
        if (first[i] == i) continue;
        row_ops_internal::Copy::Apply<decltype(fixed)::value>(
            out + i * width, out + first[i] * width, width);
      }
    });
  }
};

// The positions in the caller's batch of a part's keys when they are not
// one run of it: gathered into pooled buffers for the request, and
// scattered back from the reply by the same positions. Immutable once
// built; shared by the part, its retries and its reply callback.
class Gathered {
 public:
  Gathered(Buffer positions, size_t count)
      : positions_(std::move(positions)), count_(count) {}
  absl::Span<const size_t> positions() const {
    return absl::MakeConstSpan(
        reinterpret_cast<const size_t*>(positions_.data()), count_);
  }

 private:
  const Buffer positions_;
  const size_t count_;
};

// A piece of an operation sent to one server: a key range, a contiguous
// slice [first, first + count) of the caller's batch, or scattered keys.
struct Part {
  bool is_range = false;  // a part of a key-range operation
  Key begin = 0, end = 0;
  size_t first = 0, count = 0;
  // Scattered keys (a batch's part that is not one run of it): their
  // positions. Null for ranges and slices.
  std::shared_ptr<const Gathered> gathered;
  // A slice whose keys are k, k + 1, ..., k + count - 1: sent as the key
  // range [k, k + count), without its keys (the server does the same to a
  // range of keys as to the batch of them).
  bool consecutive = false;
  NodeId server = kNoNode;
  int attempt = 0;
  // The write's sequence number, fixed at its first send so that a retry
  // is recognised by the range (0: not assigned yet, or a read).
  uint64_t seq = 0;
  // A synced sparse batch: the range it speaks for (sent even when empty).
  Key range_begin = 0, range_end = 0;

  size_t size() const {
    return is_range ? end - begin
                    : (gathered ? gathered->positions().size() : count);
  }
  // Offset, in keys, of a range or slice within the caller's arrays.
  size_t offset(const OpState& op) const {
    return is_range ? begin - op.keys.begin() : first;
  }
  Key first_key(const OpState& op) const {
    if (is_range) return begin;
    return op.keys.batch()[gathered ? gathered->positions()[0] : first];
  }
};

// The positions in the caller's batch that `scope` covers: all `size` of
// them for a first routing (scope == nullptr), else the retried part's.
Selection SelectionOf(const Part* scope, size_t size) {
  if (scope == nullptr) return Selection::Slice(0, size);
  if (scope->gathered) return Selection::List(scope->gathered->positions());
  return Selection::Slice(scope->first, scope->count);
}

// Runs closures after a delay on one thread (retries must not block the
// transport's I/O thread). The thread sleeps until the earliest deadline or
// until a closure is queued, never polls.
class DelayQueue {
 public:
  DelayQueue() : thread_([this] { Run(); }) {}
  ~DelayQueue() { Stop(); }
  // Runs what is queued now; later closures run inline in After().
  void Stop() {
    {
      absl::MutexLock lock(&mu_);
      stop_ = true;
    }
    if (thread_.joinable()) thread_.join();
  }
  void After(absl::Duration delay, std::function<void()> fn) {
    {
      absl::MutexLock lock(&mu_);
      if (!stop_) {
        items_.emplace(absl::Now() + delay, std::move(fn));
        ++queued_;
        return;
      }
    }
    fn();
  }

 private:
  void Run() {
    while (true) {
      std::vector<std::function<void()>> due;
      {
        absl::MutexLock lock(&mu_);
        // Wake at the earliest deadline, or when something is queued (it
        // may be due sooner) or the queue stops.
        const uint64_t seen = queued_;
        auto changed = [this, seen]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
          return stop_ || queued_ != seen;
        };
        const absl::Time wake =
            items_.empty() ? absl::InfiniteFuture() : items_.begin()->first;
        mu_.AwaitWithDeadline(absl::Condition(&changed), wake);
        const absl::Time now = absl::Now();
        while (!items_.empty() && (stop_ || items_.begin()->first <= now)) {
          due.push_back(std::move(items_.begin()->second));
          items_.erase(items_.begin());
        }
        if (stop_ && due.empty()) return;
      }
      for (auto& fn : due) fn();
    }
  }

  absl::Mutex mu_;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  uint64_t queued_ ABSL_GUARDED_BY(mu_) = 0;
  std::multimap<absl::Time, std::function<void()>> items_ ABSL_GUARDED_BY(mu_);
  std::thread thread_;
};

// The retry thread of the client whose Wait this thread is pumping in.
thread_local DelayQueue* pumping_for = nullptr;

void RunCallback(Callback callback, const absl::Status& status) {
  if (pumping_for == nullptr) return callback(status);
  pumping_for->After(absl::ZeroDuration(), [callback = std::move(callback),
                                            status] { callback(status); });
}

// Whether a failed part is worth sending again, from its typed reason: the
// map moved, a server is behind the request's map, a range is being handed
// over, or the connection broke. Everything else (including a range with
// no live holder: the map names nobody to send it to) fails the operation.
bool Retriable(const absl::Status& s) {
  switch (ReasonOf(s)) {
    case ErrorReason::kNotOwner:
    case ErrorReason::kServerBehind:
    case ErrorReason::kHandingOver:
    case ErrorReason::kConnectionLost:
      return true;
    default:
      return false;
  }
}

class ClientImpl final : public Client {
 public:
  explicit ClientImpl(const ClientOptions& options)
      : options_(options),
        scheduler_(options.scheduler_address, absl::Seconds(10), options.auth) {
  }

  ~ClientImpl() override {
    shutting_down_.store(true);
    scheduler_.CancelWatch();
    if (watch_thread_.joinable()) watch_thread_.join();
    if (retries_ != nullptr) retries_->Stop();
    data_.reset();  // fails whatever is still in flight
    retries_.reset();
  }

  absl::Status Init() {
    DataClientOptions data_options;
    data_options.auth = options_.auth;
    data_options.on_disconnect = [this](const std::string& endpoint) {
      ReportBrokenConnection(endpoint);
    };
    DP_ASSIGN_OR_RETURN(data_, DataClient::Create(data_options, &pool_));
    const absl::Time deadline = absl::Now() + options_.connect_timeout;
    absl::StatusOr<proto::ClusterMap> map;
    do {
      map = scheduler_.GetClusterMap();
      if (map.ok() || map.status().code() != absl::StatusCode::kUnavailable) {
        break;
      }
      absl::SleepFor(absl::Milliseconds(100));
    } while (absl::Now() < deadline);
    DP_RETURN_IF_ERROR(map.status());
    UpdateMap(*std::move(map));
    retries_ = std::make_unique<DelayQueue>();
    watch_thread_ = std::thread([this] { WatchLoop(); });
    return absl::OkStatus();
  }

  absl::StatusOr<Table> CreateTable(const TableOptions& o) override;
  absl::StatusOr<Table> OpenTable(const std::string& name) override;

  Ticket Put(const Table& t, Keys k, absl::Span<const float> v,
             Callback cb) override {
    return Submit(proto::PUT, t, k, v, {}, std::move(cb));
  }
  Ticket Add(const Table& t, Keys k, absl::Span<const float> v,
             Callback cb) override {
    return Submit(proto::ADD, t, k, v, {}, std::move(cb));
  }
  Ticket Push(const Table& t, Keys k, absl::Span<const float> g,
              Callback cb) override {
    return Submit(proto::PUSH, t, k, g, {}, std::move(cb));
  }
  Ticket Get(const Table& t, Keys k, absl::Span<float> out,
             Callback cb) override {
    return Submit(proto::GET, t, k, {}, out, std::move(cb));
  }
  Ticket Pull(const Table& t, Keys k, absl::Span<float> out,
              Callback cb) override {
    return Submit(proto::PULL, t, k, {}, out, std::move(cb));
  }
  Ticket PushPull(const Table& t, Keys k, absl::Span<const float> g,
                  absl::Span<float> out, Callback cb) override {
    return Submit(proto::PUSH_PULL, t, k, g, out, std::move(cb));
  }
  Ticket AddOnce(const Table& t, Keys k, absl::Span<const float> v,
                 int64_t round, uint64_t task, Callback cb) override {
    return Submit(proto::ADD, t, k, v, {}, std::move(cb), round, task);
  }
  Ticket SubmitVector(const Table& t, VectorRequest* request) override;
  TrafficStats traffic() const override {
    TrafficStats s;
    s.requests = requests_.load(std::memory_order_relaxed);
    s.bytes_sent = bytes_sent_.load(std::memory_order_relaxed);
    s.bytes_received = bytes_received_.load(std::memory_order_relaxed);
    s.spins = spins_.load(std::memory_order_relaxed);
    s.spins_caught = spins_caught_.load(std::memory_order_relaxed);
    return s;
  }

  absl::Status Wait(Ticket ticket, absl::Duration timeout) override;
  bool SpinUntil(absl::FunctionRef<bool()> done) override;

  Epoch map_epoch() const override { return Map()->epoch(); }
  absl::Status CheckTable(const Table& t) const override {
    auto map = Map();
    const proto::TableMap* table = map->FindTable(t.id);
    if (table == nullptr) {
      return absl::NotFoundError(absl::StrCat("table '", t.name, "' (id ", t.id,
                                              ") is not in the cluster map"));
    }
    for (const proto::RangeAssignment& r : table->ranges()) {
      if (r.lost()) {
        return absl::DataLossError(
            absl::StrCat("table '", t.name, "' keys [", r.begin(), ", ",
                         r.end(), ") were lost (epoch ", map->epoch(), ")"));
      }
      const proto::NodeInfo* node = map->FindNode(r.primary());
      if (node == nullptr || node->state() != proto::ALIVE) {
        return absl::UnavailableError(absl::StrCat(
            "table '", t.name, "' keys [", r.begin(), ", ", r.end(),
            "): server ", r.primary(),
            node != nullptr ? absl::StrCat(" ('", node->name(), "')") : "",
            " is dead and no live server holds them (epoch ", map->epoch(),
            ")"));
      }
    }
    return absl::OkStatus();
  }

  void SetWorkerClock(int rank, int64_t clock) override {
    worker_rank_.store(rank);
    worker_clock_.store(clock);
  }
  int64_t max_staleness() const override { return max_staleness_.load(); }
  uint64_t discarded_pushes() const override { return discarded_.load(); }

 private:
  std::shared_ptr<const ClusterMapView> Map() const {
    absl::MutexLock lock(&map_mu_);
    return map_;
  }
  void UpdateMap(proto::ClusterMap map) {
    auto view = std::make_shared<const ClusterMapView>(std::move(map));
    std::shared_ptr<const ClusterMapView> old;
    {
      absl::MutexLock lock(&map_mu_);
      if (map_ != nullptr && view->epoch() <= map_->epoch()) return;
      old = map_;
      map_ = view;
      epoch_.store(view->epoch(), std::memory_order_release);
    }
    if (old == nullptr || data_ == nullptr) return;
    // Requests in flight to a server the map now calls dead will get no
    // answer: fail them now, so that they are sent where their ranges went.
    for (const proto::NodeInfo& n : old->proto().nodes()) {
      if (n.role() != proto::SERVER || n.state() != proto::ALIVE) continue;
      const proto::NodeInfo* now = view->FindNode(n.id());
      if (now != nullptr && now->state() == proto::ALIVE &&
          now->data_endpoint() == n.data_endpoint()) {
        continue;
      }
      data_->Reset(
          n.data_endpoint(),
          WithReason(absl::UnavailableError(absl::StrCat(
                         "server ", n.id(), " (", n.data_endpoint(),
                         ") left the cluster map in epoch ", view->epoch())),
                     ErrorReason::kConnectionLost));
    }
  }
  // A data connection to a server broke: tell the scheduler, which then
  // declares it dead unless it hears from it within a short grace (faster
  // than missed heartbeats, and harmless if the server is alive). On the
  // transport's I/O thread: the call itself goes to `reports_`.
  void ReportBrokenConnection(const std::string& endpoint) {
    if (shutting_down_.load()) return;
    NodeId server = kNoNode;
    for (const proto::NodeInfo& n : Map()->proto().nodes()) {
      if (n.data_endpoint() == endpoint && n.state() == proto::ALIVE) {
        server = n.id();
      }
    }
    if (server == kNoNode) return;
    {
      absl::MutexLock lock(&reports_mu_);
      const absl::Time now = absl::Now();
      absl::Time& last = last_report_[server];
      if (now - last < absl::Seconds(1)) return;  // one report is enough
      last = now;
    }
    reports_.Schedule([this, server, endpoint] {
      absl::Status s = scheduler_.ReportUnreachable(
          kNoNode, server,
          absl::StrCat("a client's data connection to ", endpoint, " broke"));
      if (!s.ok()) DP_LOG(WARNING) << s;
    });
  }

  // Sends `req` to `server` at `endpoint`, routed on the map of
  // `routed_epoch`. UpdateMap fails what is in flight to a server a new map
  // calls dead; a request queued just after that (routed on the old map)
  // would wait for its deadline on a dead endpoint, so it is failed here
  // (and retried where its range went). DataClient applies a Reset after
  // the sends queued before it, and UpdateMap publishes the map before it
  // resets, so one of the two always sees the other.
  void SendTo(const std::string& endpoint, NodeId server, Epoch routed_epoch,
              OutgoingRequest req, absl::Time deadline,
              DataClient::ReplyCallback done) {
    data_->Send(endpoint, std::move(req), deadline, std::move(done));
    // Without the map's lock when it has not moved (nearly always). If
    // this misses a new map, its Reset was queued after this send (the
    // data client's lock orders the two) and fails it.
    if (epoch_.load(std::memory_order_acquire) == routed_epoch) return;
    std::shared_ptr<const ClusterMapView> now = Map();
    if (now->epoch() == routed_epoch) return;
    const proto::NodeInfo* n = now->FindNode(server);
    if (n != nullptr && n->state() == proto::ALIVE &&
        n->data_endpoint() == endpoint) {
      return;
    }
    data_->Reset(endpoint, WithReason(absl::UnavailableError(absl::StrCat(
                                          "server ", server, " (", endpoint,
                                          ") left the cluster map in epoch ",
                                          now->epoch())),
                                      ErrorReason::kConnectionLost));
  }

  void RefreshMap() {
    auto map = scheduler_.GetClusterMap();
    if (map.ok()) UpdateMap(*std::move(map));
  }
  void WatchLoop() {
    while (true) {
      absl::Status s = scheduler_.Watch(
          kNoNode, map_epoch(),
          [this](const proto::ClusterMap& m) { UpdateMap(m); });
      if (s.ok()) return;  // cancelled
      absl::SleepFor(absl::Milliseconds(200));
    }
  }

  Ticket Submit(proto::Op op, const Table& t, Keys keys,
                absl::Span<const float> in, absl::Span<float> out, Callback cb,
                int64_t round = 0, uint64_t task = 0);
  void CountSent(const OutgoingRequest& req) {
    requests_.fetch_add(1, std::memory_order_relaxed);
    bytes_sent_.fetch_add(
        req.header.ByteSizeLong() + req.keys.size() + req.values.size(),
        std::memory_order_relaxed);
  }
  void CountReceived(const IncomingMessage& reply) {
    bytes_received_.fetch_add(
        reply.header.ByteSizeLong() + reply.values.size() * sizeof(float),
        std::memory_order_relaxed);
  }
  // Splits `scope` (the whole op, or a part being retried) by owner and
  // sends the pieces. Errors go into op.
  void Route(const std::shared_ptr<OpState>& op, const Part* scope);
  // A clocked push to a sparse table with sync_workers: one part per
  // server owning a range of it, empty ones included.
  void RouteSyncedBatch(const std::shared_ptr<OpState>& op, const Part* scope,
                        const proto::TableMap& table,
                        const ClusterMapView& map);
  // A batch's parts, cut at `max_rows` keys (and options_.part_bytes).
  void RouteBatch(const std::shared_ptr<OpState>& op, const Part* scope,
                  const proto::TableMap& table, const ClusterMapView& map,
                  size_t max_rows);
  // Sends one part; a scattered part's frames may come gathered already.
  void Send(const std::shared_ptr<OpState>& op, Part part,
            const ClusterMapView& map, Payload key_frame = Payload(),
            Payload value_frame = Payload());
  // A vector command's part: the command restricted to the part's keys.
  void SendVector(const std::shared_ptr<OpState>& op, Part part,
                  const ClusterMapView& map, const proto::NodeInfo& node);
  void OnReply(const std::shared_ptr<OpState>& op, const Part& part,
               const std::string& endpoint, const absl::Status& status,
               const IncomingMessage* reply);
  std::string Describe(const OpState& op, const Part& part) const;
  // The largest request this client sends: its own limit, or the smallest a
  // live server takes if that is less.
  size_t MessageLimit(const ClusterMapView& map) const {
    const uint64_t servers = map.min_server_message_bytes();
    return servers > 0 ? std::min<size_t>(options_.max_message_bytes, servers)
                       : options_.max_message_bytes;
  }
  // Room left in a request for its header.
  static constexpr size_t kHeaderAllowance = 4096;

  const ClientOptions options_;
  SchedulerClient scheduler_;
  BufferPool pool_;
  std::unique_ptr<DataClient> data_;
  std::unique_ptr<DelayQueue> retries_;
  std::thread watch_thread_;

  mutable absl::Mutex map_mu_;
  std::shared_ptr<const ClusterMapView> map_ ABSL_GUARDED_BY(map_mu_);
  std::atomic<Epoch> epoch_{0};  // map_'s, set with it

  absl::Mutex ops_mu_;
  absl::flat_hash_map<Ticket, std::shared_ptr<OpState>> ops_
      ABSL_GUARDED_BY(ops_mu_);
  std::atomic<Ticket> next_ticket_{1};
  // Operations submitted and not complete (shared: an operation's last
  // reply may outlive the client's members during its shutdown).
  const std::shared_ptr<std::atomic<int>> running_ =
      std::make_shared<std::atomic<int>>(0);
  // Of those, the ones with a callback (Wait pumps only without them).
  const std::shared_ptr<std::atomic<int>> with_callback_ =
      std::make_shared<std::atomic<int>>(0);
  client_internal::SpinBackoff spin_backoff_;  // SpinUntil's
  std::atomic<uint64_t> spins_{0};
  std::atomic<uint64_t> spins_caught_{0};
  std::atomic<int> worker_rank_{0};
  std::atomic<int64_t> worker_clock_{-1};
  std::atomic<int64_t> max_staleness_{0};
  std::atomic<uint64_t> discarded_{0};
  std::atomic<uint64_t> requests_{0};
  std::atomic<uint64_t> bytes_sent_{0};
  std::atomic<uint64_t> bytes_received_{0};
  std::atomic<bool> shutting_down_{false};
  // Reports of broken connections, sent off the I/O thread, at most one a
  // second per server.
  absl::Mutex reports_mu_;
  absl::flat_hash_map<NodeId, absl::Time> last_report_
      ABSL_GUARDED_BY(reports_mu_);
  SerialExecutor reports_;

  // Exactly once across retries: this client's random id, and the writes it
  // may still retry (a server forgets those below the smallest).
  const uint64_t client_id_ = RandomId();
  OpenWrites open_writes_;
  // A write's part holds its number while it is in flight: a new number at
  // its first send; a part cut from a retried one holds that one's number.
  void HoldSeq(Part* part) {
    if (part->seq == 0) {
      part->seq = open_writes_.Open();
    } else {
      open_writes_.Retain(part->seq);
    }
  }
};

// "ssp:3" -> SSP, 3. kInvalidArgument for another name.
absl::Status ParseTableConsistency(const std::string& name,
                                   proto::TableSpec* spec) {
  if (name.empty()) return absl::OkStatus();
  if (name == "bsp") {
    spec->set_consistency(proto::BSP);
  } else if (name == "asp") {
    spec->set_consistency(proto::ASP);
  } else if (absl::StartsWith(name, "ssp:")) {
    int64_t s = -1;
    if (!absl::SimpleAtoi(name.substr(4), &s) || s < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("table '", spec->name(), "': consistency '", name,
                       "': the staleness bound of ssp:N is a number >= 0"));
    }
    spec->set_consistency(proto::SSP);
    spec->set_staleness(s);
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat("table '", spec->name(), "': consistency '", name,
                     "' is not bsp, ssp:N or asp"));
  }
  return absl::OkStatus();
}

std::string TableConsistency(const proto::TableSpec& spec) {
  if (!spec.follows_job()) return "";
  switch (spec.consistency()) {
    case proto::BSP:
      return "bsp";
    case proto::SSP:
      return absl::StrCat("ssp:", spec.staleness());
    case proto::ASP:
      return "asp";
    default:
      return "";
  }
}

Table TableFromSpec(const proto::TableSpec& spec) {
  Table t;
  t.consistency = TableConsistency(spec);
  t.bounded = spec.has_bounds();
  t.id = spec.id();
  t.name = spec.name();
  t.width = spec.width();
  t.sparse = spec.kind() == proto::SPARSE;
  t.num_keys = spec.num_keys();
  t.vectors.assign(spec.vectors().begin(), spec.vectors().end());
  t.allow_non_finite = spec.allow_non_finite();
  t.sum_repeats = spec.sum_repeats();
  return t;
}

absl::StatusOr<Table> ClientImpl::CreateTable(const TableOptions& o) {
  proto::TableSpec spec;
  spec.set_name(o.name);
  spec.set_kind(o.sparse ? proto::SPARSE : proto::DENSE);
  spec.set_width(o.width);
  spec.set_num_keys(o.sparse ? 0 : o.num_keys);
  proto::InitializerSpec* init = spec.mutable_init();
  init->set_seed(o.init_seed);
  if (o.init == "zeros") {
    init->set_kind(proto::InitializerSpec::ZEROS);
  } else if (o.init == "constant") {
    init->set_kind(proto::InitializerSpec::CONSTANT);
    init->set_value(o.init_a);
  } else if (o.init == "uniform") {
    init->set_kind(proto::InitializerSpec::UNIFORM);
    init->set_low(o.init_a);
    init->set_high(o.init_b);
  } else if (o.init == "normal") {
    init->set_kind(proto::InitializerSpec::NORMAL);
    init->set_mean(o.init_a);
    init->set_stddev(o.init_b);
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat("table '", o.name, "': unknown initializer '", o.init,
                     "' (zeros, constant, uniform, normal)"));
  }
  for (const std::string& v : o.vectors) spec.add_vectors(v);
  spec.set_sync_workers(o.sync_workers);
  spec.set_allow_non_finite(o.allow_non_finite);
  spec.set_sum_repeats(o.sum_repeats);
  spec.set_num_workers(o.tracked_workers);
  spec.set_follows_job(o.follows_job);
  DP_RETURN_IF_ERROR(ParseTableConsistency(o.consistency, &spec));
  if (o.bounds.has_value()) {
    const TableOptions::Bounds& b = *o.bounds;
    proto::SparseBounds* p = spec.mutable_bounds();
    p->set_max_rows(b.max_rows);
    p->set_max_bytes(b.max_bytes);
    if (b.eviction == "none" || b.eviction.empty()) {
      p->set_eviction(proto::SparseBounds::EVICTION_NONE);
    } else if (b.eviction == "lru") {
      p->set_eviction(proto::SparseBounds::LRU);
    } else if (b.eviction == "lfu") {
      p->set_eviction(proto::SparseBounds::LFU);
    } else {
      return absl::InvalidArgumentError(
          absl::StrCat("table '", o.name, "': eviction '", b.eviction,
                       "' is not none, lru or lfu"));
    }
    p->set_ttl_clocks(b.ttl_clocks);
    p->set_ttl_seconds(b.ttl_seconds);
    p->set_admit_after(b.admit_after);
    p->set_max_pending_ids(b.max_pending_ids);
    p->set_cold_tier(b.cold_tier);
  }
  spec.mutable_handler()->set_name(o.handler);
  for (const auto& [k, v] : o.handler_params) {
    (*spec.mutable_handler()->mutable_params())[k] = v;
  }
  DP_ASSIGN_OR_RETURN(proto::CreateTableReply reply,
                      scheduler_.CreateTable(spec, options_.op_timeout));
  // Route by a map at least as new as the one that declared the table.
  const absl::Time deadline = absl::Now() + options_.op_timeout;
  while (map_epoch() < reply.epoch() && absl::Now() < deadline) {
    RefreshMap();
    if (map_epoch() < reply.epoch()) absl::SleepFor(absl::Milliseconds(10));
  }
  return TableFromSpec(reply.spec());
}

absl::StatusOr<Table> ClientImpl::OpenTable(const std::string& name) {
  auto map = Map();
  auto table = map->FindTable(name);
  if (!table.ok()) {
    RefreshMap();
    map = Map();
    table = map->FindTable(name);
  }
  DP_RETURN_IF_ERROR(table.status());
  return TableFromSpec((*table)->spec());
}

std::string ClientImpl::Describe(const OpState& op, const Part& part) const {
  std::string keys =
      part.is_range ? absl::StrCat("keys [", part.begin, ", ", part.end, ")")
      : part.size() == 0
          ? std::string("0 keys")
          : absl::StrCat(part.size(), " keys from ", part.first_key(op));
  return absl::StrCat(OpName(op.op), " table '", op.table.name, "' ", keys);
}

Ticket ClientImpl::Submit(proto::Op op, const Table& t, Keys keys,
                          absl::Span<const float> in, absl::Span<float> out,
                          Callback cb, int64_t round, uint64_t task) {
  const Ticket ticket = next_ticket_.fetch_add(1);
  auto state = std::make_shared<OpState>(op, t, keys, in.data(), out.data(),
                                         absl::Now() + options_.op_timeout,
                                         std::move(cb));
  state->running = running_;
  running_->fetch_add(1, std::memory_order_relaxed);
  if (state->callback) {
    state->with_callback = with_callback_;
    with_callback_->fetch_add(1, std::memory_order_relaxed);
    // No Wait will pump for its reply: the I/O thread must have the
    // sockets.
    data_->TakeBackSockets();
  }
  state->rank = worker_rank_.load();
  state->clock = worker_clock_.load();
  state->round = round;
  state->task = task;
  if (!state->callback) {
    absl::MutexLock lock(&ops_mu_);
    ops_[ticket] = state;
  }
  const unsigned __int128 floats =
      static_cast<unsigned __int128>(keys.size()) * t.width;
  absl::Status invalid;
  if (t.id == kNoTable || t.width == 0) {
    invalid = absl::InvalidArgumentError("table handle is not initialized");
  } else if (keys.is_range() && keys.begin() > keys.end()) {
    invalid = absl::InvalidArgumentError(absl::StrCat(
        "inverted key range [", keys.begin(), ", ", keys.end(), ")"));
  } else if (OpWrites(op) && floats != in.size()) {
    invalid = absl::InvalidArgumentError(
        absl::StrCat(OpName(op), " table '", t.name, "': ", in.size(),
                     " values for ", keys.size(), " keys of width ", t.width));
  } else if (OpReads(op) && floats != out.size()) {
    invalid = absl::InvalidArgumentError(absl::StrCat(
        OpName(op), " table '", t.name, "': output holds ", out.size(),
        " floats, need ", keys.size(), " keys x width ", t.width));
  } else if ((op == proto::PUSH || op == proto::PUSH_PULL) &&
             !t.allow_non_finite) {
    // Checked here too (the servers check each part), so that a bad
    // gradient is refused whole, before any part of it is applied.
    const size_t i = FirstNonFinite(in);
    if (i < in.size()) {
      const size_t row = i / t.width;
      const Key key = keys.is_range() ? keys.begin() + row : keys.batch()[row];
      invalid = absl::InvalidArgumentError(absl::StrCat(
          OpName(op), " table '", t.name, "': the gradient of key ", key,
          " (column ", i % t.width, ") is ", in[i],
          "; pushes must be finite (TableOptions::allow_non_finite)"));
    }
  }
  if (!invalid.ok()) {
    state->Fail(invalid);
  } else if (keys.size() > 0 ||
             (op == proto::PUSH && !keys.is_range() && state->clock >= 0)) {
    // An empty clocked push may still have to reach every server (a
    // synced sparse table, see Route).
    Route(state, nullptr);
  }
  state->Release();  // the submitter's hold
  return ticket;
}

Ticket ClientImpl::SubmitVector(const Table& t, VectorRequest* request) {
  const Ticket ticket = next_ticket_.fetch_add(1);
  const proto::VectorCommand& c = request->command;
  const Key space_end = t.sparse ? kKeySpaceEnd : t.num_keys;
  const Key lo = c.begin();
  const Key hi = c.end() == 0 ? space_end : c.end();
  auto state = std::make_shared<OpState>(
      proto::VECTOR, t, Keys::Range(lo, std::max(lo, hi)), nullptr, nullptr,
      absl::Now() + options_.op_timeout, nullptr);
  state->vector = request;
  state->running = running_;
  running_->fetch_add(1, std::memory_order_relaxed);
  {
    absl::MutexLock lock(&ops_mu_);
    ops_[ticket] = state;
  }
  if (t.id == kNoTable || t.width == 0) {
    state->Fail(absl::InvalidArgumentError("table handle is not initialized"));
  } else if (c.end() != 0 && (lo >= hi || hi > space_end)) {
    state->Fail(absl::InvalidArgumentError(absl::StrCat(
        "vector command range [", lo, ", ", c.end(),
        ") is empty or outside [0, ", space_end, ") of table '", t.name, "'")));
  } else {
    Route(state, nullptr);
  }
  state->Release();  // the submitter's hold
  return ticket;
}

// Whether `t` has a larger id than every table of `map` (the scheduler
// gives out table ids in increasing order).
bool NewerThanAll(const ClusterMapView& map, const Table& t) {
  for (const proto::TableMap& m : map.proto().tables()) {
    if (m.spec().id() >= t.id) return false;
  }
  return true;
}

void ClientImpl::Route(const std::shared_ptr<OpState>& op, const Part* scope) {
  auto map = Map();
  const proto::TableMap* table = map->FindTable(op->table.id);
  if (table == nullptr && scope == nullptr && NewerThanAll(*map, op->table)) {
    // A handle from another client can name a table newer than this
    // client's map, whose watch may not have brought it yet: ask the
    // scheduler once before calling the table unknown. Ids only grow, so a
    // handle whose id this map has passed (another cluster's, a made-up
    // one) is refused without asking, and a loop on it does not load the
    // scheduler. A part sent again (scope) was routed after a refresh.
    RefreshMap();
    map = Map();
    table = map->FindTable(op->table.id);
  }
  if (table == nullptr) {
    op->Fail(absl::NotFoundError(absl::StrCat(
        OpName(op->op), ": unknown table '", op->table.name, "' (id ",
        op->table.id, ", cluster map epoch ", map->epoch(), ")")));
    return;
  }
  const size_t width = op->table.width;
  // Parts are cut to what both this client and every server take (the
  // servers' limit counts the whole request: header, keys and values).
  const size_t limit = MessageLimit(*map);
  const size_t row_bytes =
      width * sizeof(float) + (op->keys.is_range() ? 0 : sizeof(Key));
  // A vector command carries no rows: one part per range, uncut.
  const size_t max_rows =
      op->op == proto::VECTOR
          ? std::numeric_limits<size_t>::max()
          : std::max<size_t>(
                1, (limit > kHeaderAllowance ? limit - kHeaderAllowance : 0) /
                       row_bytes);
  auto outside = [&](Key k) {
    op->Fail(absl::OutOfRangeError(
        absl::StrCat(OpName(op->op), " table '", op->table.name, "': key ", k,
                     " is outside the table's key space")));
  };
  if (op->keys.is_range()) {
    const Key b = scope ? scope->begin : op->keys.begin();
    const Key e = scope ? scope->end : op->keys.end();
    // A table that aggregates BSP steps aggregates each stretch between a
    // range's step cuts apart: a synced push is cut there too.
    const bool synced =
        op->clock >= 0 && OpWrites(op->op) && table->spec().sync_workers() > 0;
    Key k = b;
    while (k < e) {
      const int r = ClusterMapView::RangeOf(*table, k);
      if (r < 0) return outside(k);
      const proto::RangeAssignment& range = table->ranges(r);
      Key stop = std::min<Key>(e, range.end());
      for (int c = 0; synced && c < range.step_cuts_size(); ++c) {
        if (range.step_cuts(c) > k) {
          stop = std::min<Key>(stop, range.step_cuts(c));
          break;
        }
      }
      for (Key c = k; c < stop;) {
        Part p;
        p.is_range = true;
        p.begin = c;
        p.end = c + std::min<Key>(stop - c, max_rows);
        p.server = range.primary();
        p.attempt = scope ? scope->attempt : 0;
        p.seq = scope ? scope->seq : 0;
        c = p.end;
        Send(op, std::move(p), *map);
      }
      k = stop;
    }
    return;
  }

  // A write that names a key more than once, to a table that sums repeats,
  // goes on as its distinct keys with summed rows (AddOnce rounds, Put and
  // PushPull apply each occurrence).
  if (scope == nullptr && table->spec().sum_repeats() && op->round == 0 &&
      (op->op == proto::PUSH || op->op == proto::ADD)) {
    absl::Span<const Key> keys = op->keys.batch();
    absl::StatusOr<size_t> distinct = SumRepeats(
        keys, op->in, width, pool_, &op->summed_keys, &op->summed_values);
    if (!distinct.ok()) {
      op->Fail(Annotate(
          distinct.status(),
          absl::StrCat(OpName(op->op), " table '", op->table.name, "'")));
      return;
    }
    if (*distinct < keys.size()) {
      op->keys = Keys(absl::MakeConstSpan(
          reinterpret_cast<const Key*>(op->summed_keys.data()), *distinct));
      op->in = reinterpret_cast<const float*>(op->summed_values.data());
    }
  }
  // Batch: split by owning range, in the caller's order.
  if (op->op == proto::PUSH && op->clock >= 0 &&
      table->spec().sync_workers() > 0 &&
      table->spec().kind() == proto::SPARSE) {
    return RouteSyncedBatch(op, scope, *table, *map);
  }
  RouteBatch(op, scope, *table, *map, max_rows);
}

void ClientImpl::RouteBatch(const std::shared_ptr<OpState>& op,
                            const Part* scope, const proto::TableMap& table,
                            const ClusterMapView& map, size_t max_rows) {
  absl::Span<const Key> keys = op->keys.batch();
  const Selection selection = SelectionOf(scope, keys.size());
  const RangeLocator ranges(table);
  // One pass over the keys; nothing is sent before every key is known to
  // be in the key space, so a bad key fails the whole batch.
  absl::StatusOr<BatchSplit> split = PlanSplit(ranges, keys, selection);
  if (!split.ok()) {
    op->Fail(Annotate(split.status(), absl::StrCat(OpName(op->op), " table '",
                                                   op->table.name, "'")));
    return;
  }
  const size_t width = op->table.width;
  // Parts of about options_.part_bytes, so that this thread gathers the
  // next part while the I/O thread sends the last and the server applies
  // the one before. An exactly-once task add is cut only at the message
  // limit: its copies must cut their keys alike.
  size_t rows = max_rows;
  if (options_.part_bytes > 0 && op->round == 0) {
    rows = std::min(
        rows, std::max<size_t>(1, options_.part_bytes /
                                      (width * sizeof(float) + sizeof(Key))));
  }
  auto part_for = [&](int range) {
    Part p;
    p.server = ranges.server(range);
    p.attempt = scope ? scope->attempt : 0;
    p.seq = scope ? scope->seq : 0;
    return p;
  };
  // A run of consecutive keys goes as a key range, except to a table that
  // aggregates clocked pushes, where a batch and a range are not the same
  // request (dense ones take ranges only).
  const bool ranges_ok =
      op->clock < 0 || table.spec().sync_workers() == 0 || !OpWrites(op->op);
  // A read whose keys repeat asks for each key once (the first routing
  // only: a retried part's keys are already distinct). Folding costs a
  // gather and a hash lookup a key, so a batch goes this way only when a
  // sample of it shows repeats; one without goes on as slices.
  // The first routing's selection is the whole batch, so a key's index in
  // it is its position.
  const bool fold =
      scope == nullptr && (op->op == proto::PULL || op->op == proto::GET) &&
      !split->consecutive && selection.size() < (size_t{1} << 32) &&
      RepeatsWorthFolding(keys, selection);
  if (split->runs && selection.list == nullptr && !fold) {
    // Each range's keys are one run of the caller's arrays: slices of them,
    // sent without copying.
    for (const BatchSplit::Group& g : split->groups) {
      for (size_t c = 0; c < g.count; c += rows) {
        Part p = part_for(g.range);
        p.first = selection.first + g.start + c;
        p.count = std::min(rows, g.count - c);
        p.consecutive =
            ranges_ok &&
            (split->consecutive || Consecutive(keys.data() + p.first, p.count));
        Send(op, std::move(p), map);
      }
    }
    return;
  }
  // Scattered: each range's keys, values and positions are gathered into
  // pooled buffers, a part at a time in the caller's order, and each part
  // is sent as soon as it is full.
  struct Open {
    size_t capacity = 0, n = 0;
    Buffer keys, values, positions;
    // Their data, read once per part instead of once per key.
    Key* key_at = nullptr;
    size_t* position_at = nullptr;
    float* value_at = nullptr;
  };
  absl::InlinedVector<size_t, 4> left(ranges.size(), 0);
  for (const BatchSplit::Group& g : split->groups) left[g.range] = g.count;
  absl::InlinedVector<Open, 4> open(ranges.size());
  const bool writes = OpWrites(op->op);
  const RowOp copy = RowCopyFor(width);
  const int only = split->groups.size() == 1 ? split->groups[0].range : -1;
  // Sends range r's open part as it stands.
  auto send_open = [&](int r) {
    Open& o = open[r];
    Part p = part_for(r);
    p.gathered = std::make_shared<Gathered>(std::move(o.positions), o.n);
    Payload key_frame = Payload::Own(std::move(o.keys));
    Payload value_frame =
        writes ? Payload::Own(std::move(o.values)) : Payload();
    left[r] -= o.n;
    o = Open();
    Send(op, std::move(p), map, std::move(key_frame), std::move(value_frame));
  };
  // Gathers the key at `pos` into its range's open part.
  auto gather = [&](size_t pos) {
    const Key k = keys[pos];
    const int r = only >= 0 ? only : ranges.Find(k);
    Open& o = open[r];
    if (o.capacity == 0) {
      o.capacity = std::min(rows, left[r]);
      o.keys = pool_.Acquire(o.capacity * sizeof(Key));
      o.positions = pool_.Acquire(o.capacity * sizeof(size_t));
      o.key_at = reinterpret_cast<Key*>(o.keys.data());
      o.position_at = reinterpret_cast<size_t*>(o.positions.data());
      if (writes) {
        o.values = pool_.Acquire(o.capacity * width * sizeof(float));
        o.value_at = reinterpret_cast<float*>(o.values.data());
      }
    }
    o.key_at[o.n] = k;
    o.position_at[o.n] = pos;
    if (writes) copy(o.value_at + o.n * width, op->in + pos * width, width);
    if (++o.n == o.capacity) send_open(r);
  };
  if (fold) {
    // Each key's first occurrence is gathered as the table finds it; a
    // repeat is not (its row is copied from its first occurrence's when
    // the reply is in, OpState::CopyRepeats) and is not looked up in the
    // ranges either, so a range's `left` counts its repeats to the end.
    op->first_seen = pool_.Acquire(selection.size() * sizeof(uint32_t));
    FirstSeen::ForThisThread(selection.size())
        .InsertBatch(keys, selection,
                     reinterpret_cast<uint32_t*>(op->first_seen.data()),
                     gather);
  } else {
    for (size_t i = 0; i < selection.size(); ++i) gather(selection.at(i));
  }
  // Parts that folded repeats end short of the size they were opened at.
  for (size_t r = 0; r < open.size(); ++r) {
    if (open[r].n > 0) send_open(static_cast<int>(r));
  }
}

void ClientImpl::RouteSyncedBatch(const std::shared_ptr<OpState>& op,
                                  const Part* scope,
                                  const proto::TableMap& whole,
                                  const ClusterMapView& map) {
  // Ranges aggregate each stretch between their step cuts apart (neighbours
  // merged since a worker on an older map pushed them apart): below, a
  // "range" is a stretch, as the servers count parts.
  proto::TableMap storage;
  const proto::TableMap& table = StepStretches(whole, &storage);
  // A retried part speaks for the stretch it was sent to (a range on the
  // map it was cut on; stretches only ever get finer). If that stretch has
  // been split since, every piece of it must hear from this rank for the
  // clock, each with the part's keys it holds (possibly none); if its
  // range was merged with a neighbour, it is still a stretch of its own.
  std::vector<int> pieces;
  if (scope != nullptr) {
    for (int r = 0; r < table.ranges_size(); ++r) {
      const proto::RangeAssignment& a = table.ranges(r);
      if (a.begin() < scope->range_end && a.end() > scope->range_begin) {
        pieces.push_back(r);
      }
    }
    if (pieces.size() == 1 &&
        table.ranges(pieces[0]).begin() == scope->range_begin &&
        table.ranges(pieces[0]).end() == scope->range_end) {
      pieces.clear();  // not split: the part goes where its keys are
    }
  }
  if (scope != nullptr && scope->size() == 0 && pieces.empty()) {
    // An empty part speaks for its range: to that range's primary now.
    Part p = *scope;
    const int r = ClusterMapView::RangeOf(table, p.range_begin);
    if (r >= 0) p.server = table.ranges(r).primary();
    Send(op, std::move(p), map);
    return;
  }
  absl::Span<const Key> keys = op->keys.batch();
  // The first routing sends every range a part, possibly empty: a range
  // applies the step once it has heard from sync_workers ranks. A retried
  // part goes only where its own keys are. Ranges in key order, so that
  // parts go out in the same order on every run.
  SplitOptions split;
  split.every_range = scope == nullptr;
  const Selection selection = SelectionOf(scope, keys.size());
  std::vector<size_t> positions(selection.size());
  for (size_t i = 0; i < positions.size(); ++i) {
    positions[i] = selection.at(i);
  }
  absl::StatusOr<std::vector<OwnerGroup>> groups =
      SplitByOwner(table, keys, positions, split);
  if (!groups.ok()) {
    op->Fail(Annotate(groups.status(), absl::StrCat(OpName(op->op), " table '",
                                                    op->table.name, "'")));
    return;
  }
  for (int r : pieces) {
    const bool has_group =
        std::any_of(groups->begin(), groups->end(),
                    [r](const OwnerGroup& g) { return g.range == r; });
    if (has_group) continue;
    OwnerGroup empty;
    empty.range = r;
    empty.server = table.ranges(r).primary();
    groups->push_back(std::move(empty));
  }
  // In key order, as the first routing sends them.
  std::sort(groups->begin(), groups->end(),
            [](const OwnerGroup& a, const OwnerGroup& b) {
              return a.range < b.range;
            });
  // One part per range and clock, not cut at max_message_bytes: the range
  // counts parts per rank. A part the servers would not take fails the
  // batch here, at once and before any part is sent (a step missing one
  // range's part would never complete), instead of being dropped by the
  // transport.
  const size_t limit = MessageLimit(map);
  const size_t row_bytes = op->table.width * sizeof(float) + sizeof(Key);
  for (const OwnerGroup& group : *groups) {
    const proto::RangeAssignment& range = table.ranges(group.range);
    const size_t bytes = group.positions.size() * row_bytes + kHeaderAllowance;
    if (bytes > limit) {
      op->Fail(absl::ResourceExhaustedError(absl::StrCat(
          OpName(op->op), " table '", op->table.name, "': a synced batch of ",
          group.positions.size(), " keys for the range from key ",
          range.begin(), " needs ", bytes, " bytes, over the message limit of ",
          limit,
          " bytes (a synced batch is not split; push fewer keys per step)")));
      return;
    }
  }
  for (const OwnerGroup& group : *groups) {
    const proto::RangeAssignment& range = table.ranges(group.range);
    Part p;
    p.server = group.server;
    p.range_begin = range.begin();
    p.range_end = range.end();
    p.attempt = scope ? scope->attempt : 0;
    const std::vector<size_t>& idx = group.positions;
    if (idx.empty() || idx.back() - idx.front() == idx.size() - 1) {
      p.first = idx.empty() ? 0 : idx.front();  // contiguous: zero-copy
      p.count = idx.size();
    } else {
      Buffer b = pool_.Acquire(idx.size() * sizeof(size_t));
      std::memcpy(b.data(), idx.data(), idx.size() * sizeof(size_t));
      p.gathered = std::make_shared<Gathered>(std::move(b), idx.size());
    }
    Send(op, std::move(p), map);
  }
}

void ClientImpl::Send(const std::shared_ptr<OpState>& op, Part part,
                      const ClusterMapView& map, Payload key_frame,
                      Payload value_frame) {
  const proto::NodeInfo* node = map.FindNode(part.server);
  if (node == nullptr || node->state() != proto::ALIVE) {
    // No live server holds the range (a failover would have named one).
    // The part holds no number yet: a retried part's number is released
    // by the retry.
    op->Fail(WithReason(absl::UnavailableError(absl::StrCat(
                            Describe(*op, part), ": server ", part.server,
                            node == nullptr ? " is unknown" : " is dead",
                            " (cluster map epoch ", map.epoch(), ")")),
                        ErrorReason::kNoLiveHolder));
    return;
  }
  if (op->op == proto::VECTOR)
    return SendVector(op, std::move(part), map, *node);
  const size_t width = op->table.width;
  const size_t n = part.size();
  const bool writes = OpWrites(op->op);
  OutgoingRequest req;
  proto::DataHeader& h = req.header;
  h.set_op(op->op);
  h.set_table_id(op->table.id);
  h.set_epoch(map.epoch());
  h.set_num_keys(n);
  h.set_width(width);
  h.set_worker_clock(op->clock);
  h.set_worker_rank(op->rank);
  h.set_vector_id(op->table.vector);
  h.set_round(op->round);
  h.set_task_id(op->task);
  if (writes) {
    HoldSeq(&part);
    h.set_client_id(client_id_);
    h.set_seq(part.seq);
    h.set_low_seq(open_writes_.Low());
  }
  if (part.range_end > 0) {
    h.set_batch_range_begin(part.range_begin);
    h.set_batch_range_end(part.range_end);
  }
  if (part.is_range) {
    h.set_is_range(true);
    h.set_range_begin(part.begin);
    h.set_range_end(part.end);
  } else if (part.consecutive && n > 0) {
    const Key first = op->keys.batch()[part.first];
    h.set_is_range(true);
    h.set_range_begin(first);
    h.set_range_end(first + n);
  }
  if (!part.gathered) {
    // A range or a slice of the caller's arrays: referenced, not copied.
    const size_t off = part.offset(*op);
    auto release = [op] { op->Release(); };
    if (!part.is_range && !part.consecutive) {
      op->Hold();
      req.keys = Payload::Borrow(op->keys.batch().data() + off, n * sizeof(Key),
                                 release);
    }
    if (writes) {
      op->Hold();
      req.values = Payload::Borrow(op->in + off * width,
                                   n * width * sizeof(float), release);
    }
  } else if (key_frame.size() == n * sizeof(Key)) {
    // Gathered by the caller (RouteBatch).
    req.keys = std::move(key_frame);
    req.values = std::move(value_frame);
  } else {
    // Scattered keys: gather into pooled buffers.
    absl::Span<const size_t> pos = part.gathered->positions();
    Buffer kb = pool_.Acquire(n * sizeof(Key));
    Key* kd = reinterpret_cast<Key*>(kb.data());
    for (size_t j = 0; j < n; ++j) kd[j] = op->keys.batch()[pos[j]];
    req.keys = Payload::Own(std::move(kb));
    if (writes) {
      const RowOp copy = RowCopyFor(width);
      Buffer vb = pool_.Acquire(n * width * sizeof(float));
      float* vd = reinterpret_cast<float*>(vb.data());
      for (size_t j = 0; j < n; ++j) {
        copy(vd + j * width, op->in + pos[j] * width, width);
      }
      req.values = Payload::Own(std::move(vb));
    }
  }
  op->Hold();  // for the reply
  CountSent(req);
  const std::string& endpoint = node->data_endpoint();
  const NodeId server = part.server;
  SendTo(endpoint, server, map.epoch(), std::move(req), op->deadline,
         [this, op, part = std::move(part), endpoint](
             const absl::Status& s, const IncomingMessage* reply) {
           OnReply(op, part, endpoint, s, reply);
         });
}

void ClientImpl::SendVector(const std::shared_ptr<OpState>& op, Part part,
                            const ClusterMapView& map,
                            const proto::NodeInfo& node) {
  OutgoingRequest req;
  req.header.set_op(proto::VECTOR);
  req.header.set_table_id(op->table.id);
  req.header.set_epoch(map.epoch());
  proto::VectorCommand* c = req.header.mutable_vector_command();
  *c = op->vector->command;
  c->set_begin(part.begin);
  c->set_end(part.end);
  if (op->vector->writes()) {
    // Each range records its part under this number and answers a retry
    // with its first result instead of running it again.
    HoldSeq(&part);
    req.header.set_client_id(client_id_);
    req.header.set_seq(part.seq);
    req.header.set_low_seq(open_writes_.Low());
  }
  op->Hold();  // for the reply
  CountSent(req);
  const std::string endpoint = node.data_endpoint();
  const NodeId server = part.server;
  SendTo(endpoint, server, map.epoch(), std::move(req), op->deadline,
         [this, op, part = std::move(part), endpoint](
             const absl::Status& s, const IncomingMessage* reply) {
           OnReply(op, part, endpoint, s, reply);
         });
}

void ClientImpl::OnReply(const std::shared_ptr<OpState>& op, const Part& part,
                         const std::string& endpoint,
                         const absl::Status& status,
                         const IncomingMessage* reply) {
  auto context = [&] {
    return absl::StrCat(Describe(*op, part), " on server ", part.server, " (",
                        endpoint, ")");
  };
  // Routes this part again after refreshing the map, off the I/O thread:
  // the map moved (not owner), the server is behind, or it went away (a
  // reset connection; the write carries its sequence number, so the range
  // applies it once however often it arrives).
  auto retry = [&](const absl::Status& why) {
    DP_VLOG(1) << "sending again: " << context() << ": " << why;
    Part again = part;
    again.attempt++;
    const absl::Duration delay =
        std::min(absl::Milliseconds(5) * (1 << std::min(again.attempt, 7)),
                 absl::Milliseconds(500));
    retries_->After(delay, [this, op, again = std::move(again)] {
      // Another part failed for good: the operation fails whatever this
      // part does, so it is not sent again (it would only hold the caller
      // until the deadline).
      if (op->failed()) {
        open_writes_.Close(again.seq);
        op->Release();
        return;
      }
      RefreshMap();
      // The parts cut from it hold its number now (HoldSeq).
      Route(op, &again);
      open_writes_.Close(again.seq);
      op->Release();
    });
  };
  absl::Status outcome = status;
  if (outcome.ok()) {
    CountReceived(*reply);
    outcome = ReplyStatus(reply->header);
  }
  if (!outcome.ok()) {
    const bool may_retry = absl::Now() < op->deadline && !shutting_down_.load();
    if (may_retry && Retriable(outcome)) return retry(outcome);
    open_writes_.Close(part.seq);
    op->Fail(Annotate(outcome, context()));
    op->Release();
    return;
  }
  const proto::DataHeader& h = reply->header;
  open_writes_.Close(part.seq);
  if (op->vector != nullptr) {
    absl::MutexLock lock(&op->vector->mu);
    op->vector->partials[part.begin].assign(h.scalars().begin(),
                                            h.scalars().end());
  }
  if (h.discarded()) discarded_.fetch_add(1, std::memory_order_relaxed);
  for (int64_t seen = max_staleness_.load();
       h.staleness() > seen &&
       !max_staleness_.compare_exchange_weak(seen, h.staleness());) {
  }
  if (OpReads(op->op)) {
    const size_t width = op->table.width;
    const size_t n = part.size();
    if (reply->values.size() != n * width) {
      op->Fail(absl::DataLossError(
          absl::StrCat(context(), ": reply holds ", reply->values.size(),
                       " floats, expected ", n * width)));
    } else if (!part.gathered) {
      std::memcpy(op->out + part.offset(*op) * width, reply->values.data(),
                  n * width * sizeof(float));
    } else {
      absl::Span<const size_t> pos = part.gathered->positions();
      const float* v = reply->values.data();
      WithFixedWidth(width, [&](auto fixed) {
        for (size_t j = 0; j < n; ++j) {
          row_ops_internal::Copy::Apply<decltype(fixed)::value>(
              op->out + pos[j] * width, v + j * width, width);
        }
      });
    }
  }
  op->Release();
}

bool ClientImpl::SpinUntil(absl::FunctionRef<bool()> done) {
  // Only for a lone operation: with others in flight Wait pumps instead,
  // or (callbacks in flight) the I/O thread needs the cores.
  if (options_.spin_wait <= absl::ZeroDuration() ||
      running_->load(std::memory_order_relaxed) > 1) {
    return done();
  }
  if (done()) return true;
  if (!spin_backoff_.ShouldSpin()) return false;
  spins_.fetch_add(1, std::memory_order_relaxed);
  const absl::Time until = absl::Now() + options_.spin_wait;
  while (!done()) {
    // Yields rather than pauses: the core stays awake, but a thread that
    // the reply is waiting for (the I/O thread, the server's, ZeroMQ's)
    // gets it at once. Pausing instead held a core from them, and the
    // spins that ran out made p99 twice raw ZeroMQ's.
    sched_yield();
    if (absl::Now() >= until) {
      spin_backoff_.RanOut();
      return false;
    }
  }
  spin_backoff_.Succeeded();
  spins_caught_.fetch_add(1, std::memory_order_relaxed);
  return true;
}

absl::Status ClientImpl::Wait(Ticket ticket, absl::Duration timeout) {
  std::shared_ptr<OpState> op;
  {
    absl::MutexLock lock(&ops_mu_);
    auto it = ops_.find(ticket);
    if (it == ops_.end()) {
      return absl::NotFoundError(
          absl::StrCat("ticket ", ticket,
                       " is unknown, already waited on, or has a callback"));
    }
    op = it->second;
  }
  const bool pump = running_->load(std::memory_order_relaxed) > 1 &&
                    with_callback_->load(std::memory_order_relaxed) == 0;
  // A lone wait leaves its reply to the I/O thread (and spins for it).
  if (!pump) data_->TakeBackSockets();
  SpinUntil([&op] { return op->done.HasBeenNotified(); });
  absl::Duration left = timeout;
  bool waiting = false;
  // With others in flight, the caller takes the replies itself (receives
  // them, runs their completions) instead of sleeping until the I/O thread
  // has: a pipelined small pull then costs the client a quarter less CPU.
  // Not while operations with callbacks are in flight: once the caller
  // stops pumping, their replies would wait for the I/O thread to take the
  // sockets back (DataClient::kPumpLinger).
  if (pump && !op->done.HasBeenNotified()) {
    const absl::Time deadline = absl::Now() + timeout;
    pumping_for = retries_.get();
    waiting = data_->Pump([&op] { return op->done.HasBeenNotified(); },
                          deadline) == DataClient::PumpResult::kWaiting;
    pumping_for = nullptr;
    left = std::max(absl::ZeroDuration(), deadline - absl::Now());
  }
  const bool done = op->done.WaitForNotificationWithTimeout(left);
  if (waiting) data_->StopWaiting();
  if (!done) {
    return absl::DeadlineExceededError(
        absl::StrCat("ticket ", ticket, " not complete after ",
                     absl::FormatDuration(timeout)));
  }
  {
    absl::MutexLock lock(&ops_mu_);
    ops_.erase(ticket);
  }
  absl::MutexLock lock(&op->mu);
  return op->status;
}

}  // namespace

absl::StatusOr<uint32_t> Table::VectorIndex(
    const std::string& vector_name) const {
  for (size_t i = 0; i < vectors.size(); ++i) {
    if (vectors[i] == vector_name) return static_cast<uint32_t>(i);
  }
  return absl::NotFoundError(
      absl::StrCat("table '", name, "' has no vector '", vector_name, "'"));
}

absl::StatusOr<Table> Table::WithVector(const std::string& vector_name) const {
  DP_ASSIGN_OR_RETURN(uint32_t index, VectorIndex(vector_name));
  Table t = *this;
  t.vector = index;
  return t;
}

absl::StatusOr<std::unique_ptr<Client>> Client::Connect(
    const ClientOptions& options) {
  if (options.scheduler_address.empty()) {
    return absl::InvalidArgumentError("no scheduler address");
  }
  if (options.spin_wait < absl::ZeroDuration() ||
      options.spin_wait > kMaxSpinWait) {
    return absl::InvalidArgumentError(absl::StrCat(
        "spin_wait is ", absl::FormatDuration(options.spin_wait),
        "; it must lie in [0, ", absl::FormatDuration(kMaxSpinWait), "]"));
  }
  // Debian's Abseil is built with its debug checks, so every Mutex lock
  // would run a deadlock detector under one global lock that every thread
  // of the SDK contends on: 64 small pulls in flight spent 10% more CPU
  // each with it. The daemons turn it off too (common/program.cc); lock
  // order is checked by clang's -Wthread-safety and the TSan stage.
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  auto client = std::make_unique<ClientImpl>(options);
  DP_RETURN_IF_ERROR(client->Init(), "connect to scheduler at ",
                     options.scheduler_address);
  return std::unique_ptr<Client>(std::move(client));
}

}  // namespace downpour
