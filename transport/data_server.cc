#include "transport/data_server.h"

#include <poll.h>
#include <sys/eventfd.h>
#include <unistd.h>
#include <zmq.h>

#include <cerrno>
#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "transport/internal/request_decoder.h"
#include "transport/internal/security.h"
#include "transport/internal/zmq_util.h"

namespace downpour {

using transport_internal::DecodeRequest;
using transport_internal::MultipartMessage;

absl::StatusOr<std::unique_ptr<DataServer>> DataServer::Create(
    const DataServerOptions& options, BufferPool* pool) {
  void* context = zmq_ctx_new();
  if (context == nullptr) {
    return transport_internal::ErrnoStatus("zmq_ctx_new");
  }
  void* socket = transport_internal::OpenSocket(context, ZMQ_ROUTER,
                                                options.max_message_bytes);
  int one = 1;
  // An unroutable reply (the client went away) fails loudly instead of
  // being dropped in silence.
  zmq_setsockopt(socket, ZMQ_ROUTER_MANDATORY, &one, sizeof(one));
  std::unique_ptr<transport_internal::ZapHandler> zap;
  std::unique_ptr<transport_internal::HandshakeMonitor> monitor;
  absl::Status s;
  if (options.auth.enabled()) {
    // The ZAP handler must be bound before the first handshake can start.
    auto z = transport_internal::ZapHandler::Create(context, options.auth);
    auto m = transport_internal::HandshakeMonitor::Create(context, socket);
    s = z.ok() ? m.status() : z.status();
    if (s.ok()) {
      zap = std::move(*z);
      monitor = std::move(*m);
      s = transport_internal::ApplyCurveServer(socket, options.auth);
    }
  }
  if (s.ok() && zmq_bind(socket, options.bind_endpoint.c_str()) != 0) {
    s = transport_internal::ErrnoStatus(
        absl::StrCat("bind data plane to ", options.bind_endpoint));
  }
  if (!s.ok()) {
    monitor.reset();
    zap.reset();
    zmq_close(socket);
    zmq_ctx_term(context);
    return s;
  }
  const int event_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (s.ok() && event_fd < 0) s = absl::InternalError("eventfd failed");
  if (!s.ok()) {
    if (event_fd >= 0) ::close(event_fd);
    monitor.reset();
    zap.reset();
    zmq_close(socket);
    zmq_ctx_term(context);
    return s;
  }
  char endpoint[256];
  size_t len = sizeof(endpoint);
  zmq_getsockopt(socket, ZMQ_LAST_ENDPOINT, endpoint, &len);
  std::unique_ptr<DataServer> server(
      new DataServer(options, pool, context, socket, endpoint, event_fd));
  server->zap_ = std::move(zap);
  server->monitor_ = std::move(monitor);
  return server;
}

DataServer::DataServer(const DataServerOptions& options, BufferPool* pool,
                       void* context, void* socket, std::string endpoint,
                       int event_fd)
    : options_(options),
      pool_(pool),
      context_(context),
      socket_(socket),
      endpoint_(std::move(endpoint)),
      event_fd_(event_fd) {}

DataServer::~DataServer() {
  Stop();
  ::close(event_fd_);
}

void DataServer::Start(Handler handler) {
  thread_ = std::thread([this, h = std::move(handler)] { Loop(h); });
}

void DataServer::Stop() {
  stop_.store(true);
  if (thread_.joinable()) thread_.join();
  {
    // Closures may hold references (payloads, replies) that must not
    // outlive the socket's context.
    absl::MutexLock lock(&posted_mu_);
    posted_.clear();
  }
  monitor_.reset();  // before the socket it watches
  zap_.reset();
  if (socket_ != nullptr) {
    zmq_close(socket_);
    socket_ = nullptr;
  }
  if (context_ != nullptr) {
    zmq_ctx_term(context_);
    context_ = nullptr;
  }
}

namespace {

void FillError(const absl::Status& status, proto::DataHeader* header) {
  SetReplyStatus(status, header);
}

}  // namespace

void DataServer::ServeSecurity() {
  zap_->Serve();
  while (auto failure = monitor_->Next()) {
    const uint64_t n =
        counters_.auth_failures.fetch_add(1, std::memory_order_relaxed) + 1;
    // A refused peer reconnects every 100 ms: log the 1st, 2nd, 4th, ...
    if ((n & (n - 1)) == 0) {
      DP_LOG(WARNING) << "refused an unauthenticated data-plane connection ("
                      << failure->endpoint << "): " << failure->description
                      << " (" << n << " so far)";
    }
  }
}

void DataServer::PostAfter(absl::Duration delay, std::function<void()> fn) {
  {
    absl::MutexLock lock(&posted_mu_);
    posted_.emplace(absl::Now() + delay, std::move(fn));
  }
  uint64_t one = 1;
  ssize_t unused = ::write(event_fd_, &one, sizeof(one));
  (void)unused;
}

size_t DataServer::PostedDue() {
  const absl::Time now = absl::Now();
  absl::MutexLock lock(&posted_mu_);
  size_t n = 0;
  for (auto it = posted_.begin(); it != posted_.end() && it->first <= now;
       ++it) {
    ++n;
  }
  return n;
}

long DataServer::RunPosted() {
  const absl::Time now = absl::Now();
  std::vector<std::function<void()>> due;
  long timeout_ms = 100;
  {
    absl::MutexLock lock(&posted_mu_);
    auto it = posted_.begin();
    for (; it != posted_.end() && it->first <= now; ++it) {
      due.push_back(std::move(it->second));
    }
    posted_.erase(posted_.begin(), it);
    if (!posted_.empty()) {
      timeout_ms = std::min<long>(
          timeout_ms,
          absl::ToInt64Milliseconds(posted_.begin()->first - now) + 1);
    }
  }
  for (auto& fn : due) fn();
  return due.empty() ? timeout_ms : 0;
}

namespace {

// Frames moved out of a received message (large ones are reference-counted
// by ZeroMQ, so nothing is copied); small or unaligned frames are copied.
class ZmqRetained final : public RetainedRequest {
 public:
  ZmqRetained(zmq_msg_t* keys, zmq_msg_t* values) {
    keys_ = Take(keys, &key_copy_);
    values_ = Take(values, &value_copy_);
    this->keys = absl::Span<const Key>(
        reinterpret_cast<const Key*>(keys_.first), keys_.second / sizeof(Key));
    this->values =
        absl::Span<const float>(reinterpret_cast<const float*>(values_.first),
                                values_.second / sizeof(float));
  }
  ~ZmqRetained() override {
    for (int i = 0; i < held_; ++i) zmq_msg_close(&msgs_[i]);
  }

 private:
  std::pair<const char*, size_t> Take(zmq_msg_t* frame,
                                      std::vector<uint64_t>* copy) {
    const size_t size = zmq_msg_size(frame);
    const char* data = static_cast<const char*>(zmq_msg_data(frame));
    if (size > 256 && reinterpret_cast<uintptr_t>(data) % alignof(Key) == 0) {
      zmq_msg_t* m = &msgs_[held_++];
      zmq_msg_init(m);
      zmq_msg_move(m, frame);
      return {static_cast<const char*>(zmq_msg_data(m)), size};
    }
    copy->resize((size + sizeof(uint64_t) - 1) / sizeof(uint64_t));
    if (size > 0) std::memcpy(copy->data(), data, size);
    return {reinterpret_cast<const char*>(copy->data()), size};
  }

  zmq_msg_t msgs_[2];
  int held_ = 0;
  std::vector<uint64_t> key_copy_, value_copy_;
  std::pair<const char*, size_t> keys_, values_;
};

}  // namespace

std::shared_ptr<const RetainedRequest> DataServer::Retain(
    const IncomingMessage& request) {
  DP_CHECK(&request == current_request_)
      << "Retain outside the handler of its request";
  auto* msg = static_cast<MultipartMessage*>(current_frames_);
  return std::make_shared<ZmqRetained>(msg->frame(2), msg->frame(3));
}

void DataServer::Loop(Handler handler) {
  MultipartMessage msg;
  std::vector<transport_internal::Frame> frames;  // msg's, identity excluded
  Buffer key_scratch, value_scratch;
  OutgoingReply reply;
  IncomingMessage request;
  // Sleeps on the sockets' descriptors, not in zmq_poll: zmq_poll looks at
  // each socket's state before and after it sleeps, two or three system
  // calls more per wake-up than the one a descriptor costs, and a pipeline
  // of small requests wakes this thread every few requests. A descriptor
  // signals only what happens after the socket's last use; each socket's
  // last use before the sleep is a receive that found it empty.
  std::vector<pollfd> fds = {
      {transport_internal::DescriptorOf(socket_), POLLIN, 0},
      {event_fd_, POLLIN, 0}};
  if (zap_ != nullptr) {
    fds.push_back(
        {transport_internal::DescriptorOf(zap_->socket()), POLLIN, 0});
    fds.push_back(
        {transport_internal::DescriptorOf(monitor_->socket()), POLLIN, 0});
  }
  // The security sockets are read to empty before the first sleep on their
  // descriptors, then whenever those signal.
  bool security_due = zap_ != nullptr;
  while (!stop_.load(std::memory_order_relaxed)) {
    // The timeout bounds how long Stop() waits and when the next posted
    // closure is due; the closures may send on the socket (deferred
    // replies), so they run before the socket is read to empty.
    const long timeout_ms = RunPosted();
    if (security_due) ServeSecurity();
    // Drain what is waiting before sleeping, in bounded batches so that
    // posted closures (a replica's acknowledgement) are not starved.
    int batch = 0;
    for (; batch < 64 && msg.Receive(socket_, ZMQ_DONTWAIT); ++batch) {
      const size_t bytes_in = msg.total_bytes(1);
      counters_.bytes_in.fetch_add(bytes_in, std::memory_order_relaxed);

      // Reused from one request to the next (a header is cleared, not
      // built and destroyed, per request).
      reply.header.Clear();
      reply.values = Payload();
      reply.deferred = false;
      request.header.Clear();  // a frame-less message parses nothing
      request.reply_token = 0;
      frames.clear();
      for (size_t i = 1; i < msg.size(); ++i) {
        frames.push_back({msg.data(i), msg.frame_size(i)});
      }
      const absl::Status framing =
          DecodeRequest(frames, options_.max_message_bytes, pool_, &key_scratch,
                        &value_scratch, &request);
      reply.header.set_request_id(request.header.request_id());
      if (!framing.ok()) {
        counters_.framing_errors.fetch_add(1, std::memory_order_relaxed);
        FillError(framing, &reply.header);
      } else {
        request.reply_token = next_token_++;
        current_frames_ = &msg;
        current_request_ = &request;
        handler(request, &reply);
        current_request_ = nullptr;
        current_frames_ = nullptr;
      }
      if (reply.deferred) {
        waiting_[request.reply_token] =
            Waiting{std::string(msg.data(0), msg.frame_size(0)),
                    request.header.request_id()};
      } else {
        SendReply(msg.data(0), msg.frame_size(0), &reply);
      }
      msg.Clear();
    }
    if (batch == 64) continue;  // the socket may hold more
    ::poll(fds.data(), fds.size(), static_cast<int>(timeout_ms));
    if (fds[1].revents & POLLIN) {
      uint64_t count;
      ssize_t unused = ::read(event_fd_, &count, sizeof(count));
      (void)unused;
    }
    security_due =
        zap_ != nullptr && ((fds[2].revents | fds[3].revents) & POLLIN);
  }
}

void DataServer::SendDeferred(DeferredReply deferred) {
  auto it = waiting_.find(deferred.reply_token);
  if (it == waiting_.end()) {
    DP_LOG(WARNING) << "no deferred request with token "
                    << deferred.reply_token;
    return;
  }
  Waiting w = std::move(it->second);
  waiting_.erase(it);
  deferred.reply.header.set_request_id(w.request_id);
  SendReply(w.identity.data(), w.identity.size(), &deferred.reply);
}

void DataServer::SendReply(const void* identity, size_t identity_size,
                           OutgoingReply* reply) {
  reply->header.SerializeToString(&header_bytes_);
  const size_t bytes_out = header_bytes_.size() + reply->values.size();
  // Identity frame first (copied: it is a few bytes), then the reply.
  bool ok = transport_internal::SendCopy(socket_, identity, identity_size,
                                         ZMQ_SNDMORE) &&
            transport_internal::SendCopy(socket_, header_bytes_.data(),
                                         header_bytes_.size(), ZMQ_SNDMORE) &&
            transport_internal::SendPayload(socket_, &reply->values, 0);
  if (!ok) {
    DP_LOG(WARNING) << "dropping reply to request "
                    << reply->header.request_id() << ": "
                    << zmq_strerror(zmq_errno());
  } else {
    counters_.bytes_out.fetch_add(bytes_out, std::memory_order_relaxed);
  }
}

}  // namespace downpour
