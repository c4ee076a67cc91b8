// The server side of the data plane: a ZeroMQ ROUTER socket that receives
// requests from any number of clients and sends each reply to its sender.
//
// One thread (started by Start) owns the socket: it receives a request,
// checks its framing, calls the handler, and sends the handler's reply with
// zero copies. Requests that are badly framed (wrong frame count, unparsable
// header, a keys frame whose length is not a multiple of 8, a values frame
// not a multiple of 4, a message over the size limit) are answered with an
// error here and never reach the handler.
//
// Deferred replies: a handler may leave a request unanswered
// (OutgoingReply::deferred) and answer it later, from inside a later call
// of the handler, with SendDeferred(request's reply_token). The server
// keeps only the sender's identity and request id meanwhile; a request
// never answered keeps those few bytes until the server stops.
#ifndef DOWNPOUR_TRANSPORT_DATA_SERVER_H_
#define DOWNPOUR_TRANSPORT_DATA_SERVER_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/auth.h"
#include "common/buffer_pool.h"
#include "transport/frames.h"

namespace downpour {
namespace transport_internal {
class HandshakeMonitor;
class ZapHandler;
}  // namespace transport_internal

struct DataServerOptions {
  // ZeroMQ endpoint; port "*" picks a free one (see DataServer::endpoint()).
  std::string bind_endpoint = "tcp://127.0.0.1:*";
  // Requests whose frames add up to more are rejected with
  // kResourceExhausted. Frames above twice this make ZeroMQ drop the peer's
  // connection, bounding the memory a hostile peer can make us allocate.
  size_t max_message_bytes = size_t{256} << 20;
  // On: only peers holding the cluster secret complete the (CURVE)
  // handshake; the others never reach the handler and are counted in
  // auth_failures.
  ClusterAuth auth;
};

// Statistics kept by the receive thread; read with relaxed loads.
struct DataServerCounters {
  std::atomic<uint64_t> framing_errors{0};
  std::atomic<uint64_t> bytes_in{0};
  std::atomic<uint64_t> bytes_out{0};
  // Connections refused in the security handshake (wrong or missing secret).
  std::atomic<uint64_t> auth_failures{0};
};

class DataServer {
 public:
  // Called on the receive thread for every well-framed request. It must fill
  // `reply` (the header's request_id is set already; status_code 0 = OK),
  // or set reply->deferred and answer later with SendDeferred.
  using Handler =
      std::function<void(const IncomingMessage& request, OutgoingReply* reply)>;

  // Binds the socket. kUnavailable if the endpoint cannot be bound.
  // `pool` must outlive the server.
  static absl::StatusOr<std::unique_ptr<DataServer>> Create(
      const DataServerOptions& options, BufferPool* pool);
  ~DataServer();  // Stop()

  // The bound endpoint, e.g. "tcp://127.0.0.1:40123".
  const std::string& endpoint() const { return endpoint_; }
  // Starts the receive thread. Call once.
  void Start(Handler handler);
  // Stops the thread (within ~100 ms) and closes the socket. Idempotent.
  void Stop();
  const DataServerCounters& counters() const { return counters_; }

  // Sends the reply of a request the handler deferred. REQUIRES: called on
  // the receive thread, i.e. from inside the handler or a posted closure. A
  // token that is not (or no longer) deferred is logged and ignored.
  void SendDeferred(DeferredReply deferred);

  // Runs `fn` on the receive thread, between requests, as soon as it can
  // (PostAfter: not before `delay`). Thread-safe; never blocks. Closures
  // still queued when the server stops are dropped unrun. This is how other
  // threads hand the receive thread work (a new cluster map, a replica's
  // acknowledgement), so that the state it owns needs no lock.
  void Post(std::function<void()> fn) {
    PostAfter(absl::ZeroDuration(), std::move(fn));
  }
  void PostAfter(absl::Duration delay, std::function<void()> fn)
      ABSL_LOCKS_EXCLUDED(posted_mu_);

  // Closures posted whose time has come and that have not run yet: how far
  // the receive thread is behind with work handed to it. Thread-safe.
  size_t PostedDue() ABSL_LOCKS_EXCLUDED(posted_mu_);
  // Requests deferred and not yet answered. REQUIRES: called on the receive
  // thread.
  size_t deferred() const { return waiting_.size(); }

  // The key and value frames of `request` kept alive past the handler
  // (without copying, except small unaligned frames). REQUIRES: called on
  // the receive thread from inside the handler of `request`.
  std::shared_ptr<const RetainedRequest> Retain(const IncomingMessage& request);

 private:
  DataServer(const DataServerOptions& options, BufferPool* pool, void* context,
             void* socket, std::string endpoint, int event_fd);
  void Loop(Handler handler);
  // Runs the posted closures that are due; returns the poll timeout (ms)
  // until the next one (at most 100).
  long RunPosted() ABSL_LOCKS_EXCLUDED(posted_mu_);
  void ServeSecurity();  // ZAP requests and handshake failures
  // Sends identity + reply; counts the bytes or logs the failure.
  void SendReply(const void* identity, size_t identity_size,
                 OutgoingReply* reply);

  const DataServerOptions options_;
  BufferPool* const pool_;
  void* context_;  // zmq context, owned
  void* socket_;   // ROUTER, used only by the receive thread once started
  const std::string endpoint_;
  // Only when auth is on; used by the receive thread.
  std::unique_ptr<transport_internal::ZapHandler> zap_;
  std::unique_ptr<transport_internal::HandshakeMonitor> monitor_;
  std::atomic<bool> stop_{false};
  // Receive thread only: the sender identity and request id of each
  // deferred request, by reply token.
  struct Waiting {
    std::string identity;
    uint64_t request_id = 0;
  };
  absl::flat_hash_map<uint64_t, Waiting> waiting_;
  uint64_t next_token_ = 1;
  std::string header_bytes_;  // receive thread only: serialization scratch
  // Receive thread only: the message being handled, for Retain.
  void* current_frames_ = nullptr;
  const IncomingMessage* current_request_ = nullptr;
  // Closures for the receive thread, by due time; event_fd_ wakes its poll.
  const int event_fd_;
  absl::Mutex posted_mu_;
  std::multimap<absl::Time, std::function<void()>> posted_
      ABSL_GUARDED_BY(posted_mu_);
  std::thread thread_;
  DataServerCounters counters_;
};

}  // namespace downpour

#endif  // DOWNPOUR_TRANSPORT_DATA_SERVER_H_
