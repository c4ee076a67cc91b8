#include "transport/data_server.h"

#include <zmq.h>

#include <cerrno>
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
  char endpoint[256];
  size_t len = sizeof(endpoint);
  zmq_getsockopt(socket, ZMQ_LAST_ENDPOINT, endpoint, &len);
  std::unique_ptr<DataServer> server(
      new DataServer(options, pool, context, socket, endpoint));
  server->zap_ = std::move(zap);
  server->monitor_ = std::move(monitor);
  return server;
}

DataServer::DataServer(const DataServerOptions& options, BufferPool* pool,
                       void* context, void* socket, std::string endpoint)
    : options_(options),
      pool_(pool),
      context_(context),
      socket_(socket),
      endpoint_(std::move(endpoint)) {}

DataServer::~DataServer() { Stop(); }

void DataServer::Start(Handler handler) {
  thread_ = std::thread([this, h = std::move(handler)] { Loop(h); });
}

void DataServer::Stop() {
  stop_.store(true);
  if (thread_.joinable()) thread_.join();
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
  header->set_status_code(static_cast<int>(status.code()));
  header->set_status_message(std::string(status.message()));
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

void DataServer::Loop(Handler handler) {
  MultipartMessage msg;
  std::vector<transport_internal::Frame> frames;  // msg's, identity excluded
  Buffer key_scratch, value_scratch;
  std::vector<zmq_pollitem_t> items = {{socket_, 0, ZMQ_POLLIN, 0}};
  if (zap_ != nullptr) {
    items.push_back({zap_->socket(), 0, ZMQ_POLLIN, 0});
    items.push_back({monitor_->socket(), 0, ZMQ_POLLIN, 0});
  }
  while (!stop_.load(std::memory_order_relaxed)) {
    // The timeout only bounds how long Stop() waits.
    if (zmq_poll(items.data(), static_cast<int>(items.size()), 100) <= 0) {
      continue;
    }
    if (zap_ != nullptr && (items[1].revents | items[2].revents)) {
      ServeSecurity();
    }
    // Drain everything that is waiting before polling again.
    while (msg.Receive(socket_, ZMQ_DONTWAIT)) {
      counters_.requests.fetch_add(1, std::memory_order_relaxed);
      const size_t bytes_in = msg.total_bytes(1);
      counters_.bytes_in.fetch_add(bytes_in, std::memory_order_relaxed);

      OutgoingReply reply;
      IncomingMessage request;
      frames.clear();
      for (size_t i = 1; i < msg.size(); ++i) {
        frames.push_back({msg.data(i), msg.frame_size(i)});
      }
      const absl::Status framing =
          DecodeRequest(frames, options_.max_message_bytes, pool_,
                        &key_scratch, &value_scratch, &request);
      reply.header.set_request_id(request.header.request_id());
      if (!framing.ok()) {
        counters_.framing_errors.fetch_add(1, std::memory_order_relaxed);
        FillError(framing, &reply.header);
      } else {
        request.reply_token = next_token_++;
        handler(request, &reply);
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
