#include "transport/data_client.h"

#include <poll.h>
#include <sys/eventfd.h>
#include <unistd.h>
#include <zmq.h>

#include <optional>
#include <queue>
#include <unordered_map>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/error_reason.h"
#include "common/logging.h"
#include "transport/internal/security.h"
#include "transport/internal/zmq_util.h"

namespace downpour {

using transport_internal::AlignedView;
using transport_internal::DescriptorOf;
using transport_internal::MultipartMessage;

namespace {

// Gives back what the request's payloads borrowed, when it is not sent (or
// only partly handed to ZeroMQ).
void ReleasePayloads(OutgoingRequest& request) {
  if (auto r = request.keys.TakeReleaseCallback()) r();
  if (auto r = request.values.TakeReleaseCallback()) r();
}

// Resets an eventfd that Signal wrote.
void Drain(int event_fd) {
  uint64_t count;
  ssize_t unused = ::read(event_fd, &count, sizeof(count));
  (void)unused;
}

}  // namespace

// Everything here is touched under the owner's io_mu_: by the I/O thread,
// by a caller sending directly (SendNow) or by one pumping (Pump).
class DataClient::Loop {
 public:
  Loop(DataClient* owner, void* context) : owner_(owner), context_(context) {}

  ~Loop() {
    monitors_.clear();  // before the sockets they watch
    for (auto& [endpoint, socket] : sockets_) zmq_close(socket);
    zmq_ctx_term(context_);
  }

  void Run();
  // A direct send from the caller's thread (see TrySendNow): false if
  // `q`'s connection is not open yet, or has requests in flight and not
  // `busy_ok`. Sets `*wake` when the I/O thread has a failure to report
  // (failed_).
  bool SendNow(Queued& q, bool busy_ok, bool* wake);
  // The I/O thread's work on a caller's thread (DataClient::Pump).
  void Pump(const std::function<bool()>& done, absl::Time deadline);
  // What is queued, sent; failures reported; every socket read to empty.
  void Flush();

 private:
  struct Pending {
    ReplyCallback done;
    absl::Time deadline;
    void* socket;
  };

  void* SocketFor(const std::string& endpoint);
  // Sends `q` on `socket`: OK and `q.done` pending, or why not, with the
  // payloads released and `q.done` left to the caller.
  absl::Status SendOn(void* socket, Queued& q);
  void SendOne(Queued q);
  void RunFailed();
  void ReceiveFrom(void* socket);
  void ExpireDeadlines();
  std::string EndpointOf(void* socket) const;
  void ResetSocket(void* socket, const absl::Status& why);
  void CheckHandshakes(void* socket);
  void FailAll(const absl::Status& status);
  // Sends what is queued (after reading the I/O thread's eventfd if
  // `read_eventfd`); false once stopping.
  bool DrainQueue(bool read_eventfd);
  // The descriptors to sleep on: `wake_fd`, then the sockets' (if
  // `sockets`), then their monitors' (their sockets in `monitored`).
  void PollSet(int wake_fd, bool sockets, std::vector<pollfd>* fds,
               std::vector<void*>* monitored);
  // The handshake reports whose descriptors signalled in `fds` (PollSet's),
  // and those of sockets opened since.
  void CheckMonitors(const std::vector<pollfd>& fds,
                     const std::vector<void*>& monitored);
  // Milliseconds until the earliest deadline, at most `most`.
  long TimeoutMs(long most) const;

  DataClient* const owner_;
  void* const context_;
  uint64_t next_id_ = 1;
  std::unordered_map<std::string, void*> sockets_;
  // Per socket: reports failed security handshakes, so that a request to a
  // server that refuses us fails at once with a reason instead of waiting
  // out its deadline.
  std::unordered_map<void*,
                     std::unique_ptr<transport_internal::HandshakeMonitor>>
      monitors_;
  // Sockets whose monitor has not been read yet: its descriptor signals
  // only what comes after a first read.
  std::vector<void*> unread_monitors_;
  std::unordered_map<uint64_t, Pending> pending_;
  // Per socket: how many of pending_ went out on it.
  std::unordered_map<void*, size_t> in_flight_;
  // (deadline, id), earliest first; entries whose id is gone are skipped.
  std::priority_queue<std::pair<absl::Time, uint64_t>,
                      std::vector<std::pair<absl::Time, uint64_t>>,
                      std::greater<>>
      deadlines_;
  MultipartMessage msg_;
  IncomingMessage reply_;     // reused: a header parsed into, per reply
  std::deque<Queued> batch_;  // the queue taken from Send, being sent
  std::deque<std::pair<size_t, std::pair<std::string, absl::Status>>> resets_;
  // Direct sends that failed: their callbacks, run by the I/O thread.
  std::vector<std::pair<ReplyCallback, absl::Status>> failed_;
  Buffer scratch_;
  std::string header_bytes_;
  std::vector<pollfd> pump_fds_;  // Pump's
  std::vector<void*> pump_monitored_;
};

absl::StatusOr<std::unique_ptr<DataClient>> DataClient::Create(
    const DataClientOptions& options, BufferPool* pool) {
  int fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (fd < 0) return absl::InternalError("eventfd failed");
  int pump_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (pump_fd < 0) {
    ::close(fd);
    return absl::InternalError("eventfd failed");
  }
  void* context = zmq_ctx_new();
  if (context == nullptr) {
    ::close(fd);
    ::close(pump_fd);
    return transport_internal::ErrnoStatus("zmq_ctx_new");
  }
  std::unique_ptr<DataClient> client(
      new DataClient(options, pool, fd, pump_fd));
  client->loop_ = std::make_unique<Loop>(client.get(), context);
  client->thread_ = std::thread([c = client.get()] { c->loop_->Run(); });
  return client;
}

DataClient::DataClient(const DataClientOptions& options, BufferPool* pool,
                       int event_fd, int pump_fd)
    : options_(options), pool_(pool), event_fd_(event_fd), pump_fd_(pump_fd) {}

DataClient::~DataClient() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  uint64_t one = 1;
  ssize_t unused = ::write(event_fd_, &one, sizeof(one));
  (void)unused;
  if (thread_.joinable()) thread_.join();
  loop_.reset();
  ::close(event_fd_);
  ::close(pump_fd_);
}

bool DataClient::TrySendNow(Queued& q) {
  // Not waiting for the lock: while the I/O thread holds it (it is
  // receiving, or running callbacks, one of which may be this caller) the
  // queue is as quick.
  if (!io_mu_.TryLock()) return false;
  bool clear;
  bool busy_ok;
  {
    absl::MutexLock lock(&mu_);
    // Nothing queued before this request, so that one thread's requests
    // leave in the order it sent them, and a Reset fails exactly the
    // requests sent before it.
    clear = !stopping_ && queue_.empty() && resets_.empty();
    busy_ok = callers_have_sockets_;
  }
  bool wake = false;
  const bool sent = clear && loop_->SendNow(q, busy_ok, &wake);
  io_mu_.Unlock();
  if (wake) Wake();
  return sent;
}

void DataClient::Send(const std::string& endpoint, OutgoingRequest request,
                      absl::Time deadline, ReplyCallback done) {
  Queued q{endpoint, std::move(request), deadline, std::move(done)};
  if (TrySendNow(q)) return;
  bool wake = false;
  bool queued = false;
  int wake_fd = event_fd_;
  {
    absl::MutexLock lock(&mu_);
    if (!stopping_) {
      // Only the first of a batch wakes the I/O thread: it takes the whole
      // queue each time it reads the eventfd, so whatever joins a queue
      // that is not empty goes out with it (a write to the eventfd is a
      // system call per request otherwise).
      wake = queue_.empty() && resets_.empty();
      // A pumping caller sends it, before it stops pumping (Pump).
      if (pumping_) wake_fd = pump_fd_;
      queue_.push_back(std::move(q));
      queued = true;
    }
  }
  if (!queued) {
    ReleasePayloads(q.request);
    q.done(absl::UnavailableError("data client is shutting down"), nullptr);
    return;
  }
  if (wake) Signal(wake_fd);
}

void DataClient::Reset(const std::string& endpoint, absl::Status why) {
  bool wake;
  int wake_fd = event_fd_;
  {
    absl::MutexLock lock(&mu_);
    if (stopping_) return;
    wake = queue_.empty() && resets_.empty();
    if (pumping_) wake_fd = pump_fd_;
    // Applied after the sends queued before it, before those queued after.
    resets_.push_back({queue_.size(), {endpoint, std::move(why)}});
  }
  if (wake) Signal(wake_fd);
}

void DataClient::Wake() { Signal(event_fd_); }

void DataClient::Signal(int fd) {
  uint64_t one = 1;
  ssize_t unused = ::write(fd, &one, sizeof(one));
  (void)unused;
}

DataClient::PumpResult DataClient::Pump(const std::function<bool()>& done,
                                        absl::Time deadline) {
  bool kick;
  {
    absl::MutexLock lock(&mu_);
    if (stopping_) return PumpResult::kNo;
    if (pumping_) {
      ++waiters_;
      return PumpResult::kWaiting;
    }
    pumping_ = true;
    kick = !callers_have_sockets_;
    SetCallersHaveSockets(true);
  }
  // Out of its poll on the sockets, to sleep on its eventfd alone: until it
  // has, it may wake for a reply this thread takes, and then wait for
  // io_mu_.
  if (kick) Wake();
  io_mu_.Lock();
  loop_->Pump(done, deadline);
  bool hand_back;
  {
    absl::MutexLock lock(&mu_);
    pumping_ = false;
    last_pump_ = absl::Now();
    // What was queued for this pump goes out below; what is queued from
    // here on wakes the I/O thread.
    hand_back = waiters_ > 0 || std::exchange(hand_back_asked_, false);
    if (hand_back) SetCallersHaveSockets(false);
  }
  loop_->Flush();
  io_mu_.Unlock();
  // Others wait for replies this thread will not take: the I/O thread
  // takes the sockets back now, not after kPumpLinger.
  if (hand_back) Wake();
  return PumpResult::kPumped;
}

void DataClient::SetCallersHaveSockets(bool callers) {
  callers_have_sockets_ = callers;
  callers_have_sockets_hint_.store(callers, std::memory_order_relaxed);
}

void DataClient::StopWaiting() {
  absl::MutexLock lock(&mu_);
  --waiters_;
}

void DataClient::TakeBackSockets() {
  if (!callers_have_sockets_hint_.load(std::memory_order_relaxed)) return;
  {
    absl::MutexLock lock(&mu_);
    if (!callers_have_sockets_) return;
    if (pumping_) {
      hand_back_asked_ = true;  // when that pump ends
      return;
    }
    SetCallersHaveSockets(false);
  }
  Wake();
}

bool DataClient::ShouldPark() {
  absl::MutexLock lock(&mu_);
  if (callers_have_sockets_ && !pumping_ &&
      (waiters_ > 0 || absl::Now() - last_pump_ >= kPumpLinger)) {
    SetCallersHaveSockets(false);
  }
  return callers_have_sockets_;
}

void* DataClient::Loop::SocketFor(const std::string& endpoint) {
  auto it = sockets_.find(endpoint);
  if (it != sockets_.end()) return it->second;
  void* s = transport_internal::OpenSocket(context_, ZMQ_DEALER,
                                           owner_->options_.max_message_bytes);
  if (s == nullptr) return nullptr;
  auto monitor = transport_internal::HandshakeMonitor::Create(
      context_, s, /*hangups_to_report=*/2,
      /*watch_disconnects=*/owner_->options_.on_disconnect != nullptr);
  if (!monitor.ok() ||
      !transport_internal::ApplyCurveClient(s, owner_->options_.auth).ok() ||
      zmq_connect(s, endpoint.c_str()) != 0) {
    if (monitor.ok()) monitor->reset();
    zmq_close(s);
    return nullptr;
  }
  sockets_[endpoint] = s;
  monitors_[s] = std::move(*monitor);
  unread_monitors_.push_back(s);
  return s;
}

void DataClient::Loop::SendOne(Queued q) {
  void* socket = SocketFor(q.endpoint);
  absl::Status s;
  if (socket == nullptr) {
    ReleasePayloads(q.request);
    s = WithReason(
        absl::UnavailableError(absl::StrCat("cannot connect to ", q.endpoint)),
        ErrorReason::kConnectionLost);
  } else {
    s = SendOn(socket, q);
  }
  if (!s.ok()) q.done(s, nullptr);
}

bool DataClient::Loop::SendNow(Queued& q, bool busy_ok, bool* wake) {
  auto it = sockets_.find(q.endpoint);
  if (it == sockets_.end()) return false;  // the I/O thread connects
  void* socket = it->second;
  // Only on a connection with nothing in flight. A send may read the
  // socket's pending signals, and so take the one a reply left on its
  // descriptor, on which the I/O thread waits: with nothing in flight no
  // reply can come (a late one follows a timeout, which resets the
  // connection). A pipeline goes through the queue, where the I/O thread
  // sends whatever queued up together on one wake-up.
  // While callers pump, no thread sleeps on the descriptors without
  // reading every socket first (DataClient::Pump).
  auto n = in_flight_.find(socket);
  if (!busy_ok && n != in_flight_.end() && n->second > 0) return false;
  absl::Status s = SendOn(socket, q);
  if (!s.ok()) {
    failed_.emplace_back(std::move(q.done), std::move(s));
    *wake = true;
  }
  return true;
}

absl::Status DataClient::Loop::SendOn(void* socket, Queued& q) {
  const uint64_t id = next_id_++;
  q.request.header.set_request_id(id);
  q.request.header.SerializeToString(&header_bytes_);
  bool ok = transport_internal::SendCopy(socket, header_bytes_.data(),
                                         header_bytes_.size(), ZMQ_SNDMORE);
  ok = ok &&
       transport_internal::SendPayload(socket, &q.request.keys, ZMQ_SNDMORE);
  ok = ok && transport_internal::SendPayload(socket, &q.request.values, 0);
  if (!ok) {
    ReleasePayloads(q.request);  // whatever was not handed to ZeroMQ
    return WithReason(
        transport_internal::ErrnoStatus(absl::StrCat("send to ", q.endpoint)),
        ErrorReason::kConnectionLost);
  }
  pending_[id] = Pending{std::move(q.done), q.deadline, socket};
  ++in_flight_[socket];
  deadlines_.emplace(q.deadline, id);
  if (deadlines_.size() > 2 * pending_.size() + 1024) {
    // Answered requests leave their deadline behind until it passes (the
    // op timeout, tens of seconds): rebuilt from what is pending, so that
    // a busy client's heap holds what is in flight, not every request of
    // the last half minute.
    std::vector<std::pair<absl::Time, uint64_t>> live;
    live.reserve(pending_.size());
    for (const auto& [pid, p] : pending_) live.emplace_back(p.deadline, pid);
    deadlines_ = decltype(deadlines_)(std::greater<>(), std::move(live));
  }
  return absl::OkStatus();
}

void DataClient::Loop::RunFailed() {
  for (auto& [done, status] : failed_) done(status, nullptr);
  failed_.clear();
}

void DataClient::Loop::ReceiveFrom(void* socket) {
  IncomingMessage& reply = reply_;
  while (msg_.Receive(socket, ZMQ_DONTWAIT)) {
    reply.values = {};
    if (msg_.size() != 2 ||
        !reply.header.ParseFromArray(msg_.data(0), msg_.frame_size(0))) {
      DP_LOG(WARNING) << "dropping malformed reply of " << msg_.size()
                      << " frames";
      continue;
    }
    auto it = pending_.find(reply.header.request_id());
    if (it == pending_.end()) continue;  // late reply after a timeout
    ReplyCallback done = std::move(it->second.done);
    --in_flight_[it->second.socket];
    pending_.erase(it);
    if (msg_.frame_size(1) % sizeof(float) != 0) {
      done(absl::DataLossError("reply values frame is not whole floats"),
           nullptr);
      continue;
    }
    reply.values = AlignedView<float>(msg_.data(1), msg_.frame_size(1),
                                      owner_->pool_, &scratch_);
    done(absl::OkStatus(), &reply);
  }
  msg_.Clear();
}

void DataClient::Loop::CheckHandshakes(void* socket) {
  auto it = monitors_.find(socket);
  if (it == monitors_.end()) return;
  std::optional<transport_internal::HandshakeMonitor::Failure> failure;
  while (auto f = it->second->Next()) failure = std::move(f);
  if (it->second->TakeDisconnect() && owner_->options_.on_disconnect) {
    owner_->options_.on_disconnect(EndpointOf(socket));
  }
  if (!failure) return;
  ResetSocket(socket, absl::UnauthenticatedError(absl::StrCat(
                          "data plane connection to ", EndpointOf(socket),
                          " refused: ", failure->description)));
}

std::string DataClient::Loop::EndpointOf(void* socket) const {
  for (const auto& [endpoint, s] : sockets_) {
    if (s == socket) return endpoint;
  }
  return "";
}

void DataClient::Loop::ResetSocket(void* socket, const absl::Status& why) {
  // Closing with linger 0 drops queued messages, which releases their
  // borrowed payloads; every request still waiting on it fails.
  std::vector<ReplyCallback> failed;
  for (auto it = pending_.begin(); it != pending_.end();) {
    if (it->second.socket == socket) {
      failed.push_back(std::move(it->second.done));
      it = pending_.erase(it);
    } else {
      ++it;
    }
  }
  sockets_.erase(EndpointOf(socket));
  monitors_.erase(socket);
  in_flight_.erase(socket);
  zmq_close(socket);
  for (auto& done : failed) done(why, nullptr);
}

void DataClient::Loop::ExpireDeadlines() {
  const absl::Time now = absl::Now();
  while (!deadlines_.empty() && deadlines_.top().first <= now) {
    const uint64_t id = deadlines_.top().second;
    deadlines_.pop();
    auto it = pending_.find(id);
    if (it == pending_.end()) continue;
    ReplyCallback done = std::move(it->second.done);
    void* socket = it->second.socket;
    --in_flight_[socket];
    pending_.erase(it);
    done(absl::DeadlineExceededError("no reply before the deadline"), nullptr);
    ResetSocket(socket, WithReason(absl::UnavailableError(absl::StrCat(
                                       "connection to ", EndpointOf(socket),
                                       " was reset after another request to it "
                                       "timed out")),
                                   ErrorReason::kConnectionLost));
  }
}

void DataClient::Loop::FailAll(const absl::Status& status) {
  auto pending = std::move(pending_);
  pending_.clear();
  in_flight_.clear();
  for (auto& [id, p] : pending) p.done(status, nullptr);
}

bool DataClient::Loop::DrainQueue(bool read_eventfd) {
  // Read before the queue is taken: a request queued after the swap below
  // finds the queue empty and writes the eventfd again (see Send).
  if (read_eventfd) Drain(owner_->event_fd_);
  // Swapped with the shared queue, so that neither allocates afresh.
  std::deque<Queued>& batch = batch_;
  auto& resets = resets_;
  bool stopping;
  {
    absl::MutexLock lock(&owner_->mu_);
    batch.swap(owner_->queue_);
    if (!owner_->resets_.empty()) resets.swap(owner_->resets_);
    stopping = owner_->stopping_;
  }
  for (size_t i = 0; i <= batch.size(); ++i) {
    while (!resets.empty() && resets.front().first == i) {
      auto it = sockets_.find(resets.front().second.first);
      if (it != sockets_.end()) {
        ResetSocket(it->second, resets.front().second.second);
      }
      resets.pop_front();
    }
    if (i < batch.size()) SendOne(std::move(batch[i]));
  }
  batch.clear();
  return !stopping;
}

void DataClient::Loop::PollSet(int wake_fd, bool sockets,
                               std::vector<pollfd>* fds,
                               std::vector<void*>* monitored) {
  fds->clear();
  monitored->clear();
  fds->push_back(pollfd{wake_fd, POLLIN, 0});
  if (!sockets) return;
  for (auto& [endpoint, socket] : sockets_) {
    fds->push_back(pollfd{DescriptorOf(socket), POLLIN, 0});
  }
  for (auto& [socket, monitor] : monitors_) {
    fds->push_back(pollfd{DescriptorOf(monitor->socket()), POLLIN, 0});
    monitored->push_back(socket);
  }
}

void DataClient::Loop::CheckMonitors(const std::vector<pollfd>& fds,
                                     const std::vector<void*>& monitored) {
  // After the replies: a socket may be closed here. Only the thread that
  // holds io_mu_ reads the monitors, and it reads each to empty, so their
  // descriptors tell the whole story.
  const size_t first_monitor = fds.size() - monitored.size();
  for (size_t i = 0; i < monitored.size(); ++i) {
    if (fds[first_monitor + i].revents & POLLIN) {
      CheckHandshakes(monitored[i]);  // nothing if its socket was closed
    }
  }
  while (!unread_monitors_.empty()) {
    CheckHandshakes(unread_monitors_.back());
    unread_monitors_.pop_back();
  }
}

long DataClient::Loop::TimeoutMs(long most) const {
  if (deadlines_.empty()) return most;
  const absl::Duration left = deadlines_.top().first - absl::Now();
  return std::max<long>(
      0, std::min<long>(most, absl::ToInt64Milliseconds(left) + 1));
}

void DataClient::Loop::Flush() {
  DrainQueue(/*read_eventfd=*/false);
  RunFailed();
  for (auto& [endpoint, socket] : sockets_) ReceiveFrom(socket);
}

void DataClient::Loop::Pump(const std::function<bool()>& done,
                            absl::Time deadline) {
  // Reused: a pipelining caller pumps once per batch of replies. A signal
  // left on pump_fd_ by a request its last pump sent in its last Flush
  // costs one turn of the loop below, less than a read here every time.
  std::vector<pollfd>& fds = pump_fds_;
  std::vector<void*>& monitored = pump_monitored_;
  fds.clear();
  monitored.clear();
  while (true) {
    // Sends first, then every socket read to empty: a send may take the
    // signal a reply left on its descriptor.
    Flush();
    CheckMonitors(fds, monitored);
    ExpireDeadlines();
    if (done()) break;
    const absl::Duration left = deadline - absl::Now();
    if (left <= absl::ZeroDuration()) break;
    PollSet(owner_->pump_fd_, /*sockets=*/true, &fds, &monitored);
    // At most 100 ms between looks at done(): what the caller waits for
    // may complete without a reply (an operation failed for good on the
    // SDK's retry thread).
    const long timeout_ms = TimeoutMs(
        left >= absl::Milliseconds(100) ? 100
                                        : absl::ToInt64Milliseconds(left) + 1);
    ::poll(fds.data(), fds.size(), static_cast<int>(timeout_ms));
    if (fds[0].revents & POLLIN) Drain(owner_->pump_fd_);
  }
}

void DataClient::Loop::Run() {
  absl::Mutex& io_mu = owner_->io_mu_;
  std::vector<pollfd> fds;
  std::vector<void*> monitored;
  bool parked = false;
  io_mu.Lock();
  while (true) {
    // While callers pump, this thread sleeps on its eventfd alone (for
    // requests queued while nobody pumps) and looks again after
    // kPumpLinger; taking the sockets back, it reads each to empty first,
    // since callers sent on them meanwhile.
    const bool park = owner_->ShouldPark();
    if (parked && !park) Flush();
    parked = park;
    // Waits on descriptors, not with zmq_poll, which would touch the
    // sockets: a caller may be sending on one meanwhile. A socket's
    // descriptor signals only that its state changed; every socket was
    // read to empty (or looked at) below, after its last use.
    PollSet(owner_->event_fd_, /*sockets=*/!park, &fds, &monitored);
    const long timeout_ms =
        park ? absl::ToInt64Milliseconds(kPumpLinger) : TimeoutMs(100);
    io_mu.Unlock();
    ::poll(fds.data(), fds.size(), static_cast<int>(timeout_ms));
    io_mu.Lock();
    if ((fds[0].revents & POLLIN) && !DrainQueue(/*read_eventfd=*/true)) {
      break;
    }
    RunFailed();
    if (park) continue;
    // Every socket, whichever descriptor woke us: a direct send may have
    // taken a reply's signal (SendNow).
    for (auto& [endpoint, socket] : sockets_) ReceiveFrom(socket);
    CheckMonitors(fds, monitored);
    ExpireDeadlines();
  }
  FailAll(absl::UnavailableError("data client is shutting down"));
  RunFailed();
  io_mu.Unlock();
}

}  // namespace downpour
