// The client side of the data plane: one DEALER socket per server endpoint,
// with any number of requests in flight per connection, matched to their
// replies by request id.
//
// An I/O thread receives the replies, runs the callbacks, opens and resets
// connections and expires deadlines. Send() may be called from any thread:
// when the I/O thread is not busy and nothing is queued before it, the
// caller sends on the socket itself when that connection has nothing in
// flight (a hand-off to the I/O thread is two system calls and a wake-up:
// a third of a lone small request's time); otherwise it queues the request
// and wakes the I/O thread through an eventfd, which sends what queued up
// together. A socket is touched by one thread at a time, under io_mu_,
// and waited on by the I/O thread through its file descriptor, without the
// lock.
#ifndef DOWNPOUR_TRANSPORT_DATA_CLIENT_H_
#define DOWNPOUR_TRANSPORT_DATA_CLIENT_H_

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/auth.h"
#include "common/buffer_pool.h"
#include "transport/frames.h"

namespace downpour {

struct DataClientOptions {
  // Replies above twice this make ZeroMQ drop the connection.
  size_t max_message_bytes = size_t{256} << 20;
  // On: connections use CURVE with the cluster's keys (see common/auth.h).
  ClusterAuth auth;
  // Called on the I/O thread when an established connection to `endpoint`
  // breaks (the server died, or the link did); must not block. Requests in
  // flight are not failed by it: ZeroMQ reconnects, and the caller decides.
  std::function<void(const std::string& endpoint)> on_disconnect;
};

class DataClient {
 public:
  // Runs on the I/O thread, exactly once per Send. On success `status` is OK
  // and `reply` is valid only during the call (its header may still carry an
  // error from the server). Otherwise `reply` is null and `status` is
  // kDeadlineExceeded (no reply by the deadline), kUnauthenticated (the
  // security handshake with that server failed: the cluster secrets differ
  // or one side has none) or kUnavailable (the client is shutting down).
  // Must not block.
  using ReplyCallback = std::function<void(const absl::Status& status,
                                           const IncomingMessage* reply)>;

  // `pool` must outlive the client.
  static absl::StatusOr<std::unique_ptr<DataClient>> Create(
      const DataClientOptions& options, BufferPool* pool);
  ~DataClient();  // fails what is in flight with kUnavailable, then stops

  // Thread-safe, non-blocking; never runs `done` itself. Assigns the
  // request id. Connects to
  // `endpoint` on first use. After a timeout the connection to that endpoint
  // is reset, so that queued messages (and their borrowed payloads) are
  // released; other requests in flight on it fail with kUnavailable.
  void Send(const std::string& endpoint, OutgoingRequest request,
            absl::Time deadline, ReplyCallback done) ABSL_LOCKS_EXCLUDED(mu_);

  // Fails every request in flight to `endpoint` with `why` and drops its
  // connection (the next Send reconnects), e.g. once the cluster map says
  // that server is dead, so that nobody waits out a deadline for it.
  // Thread-safe, non-blocking; requests sent before this call are failed,
  // later ones are not.
  void Reset(const std::string& endpoint, absl::Status why)
      ABSL_LOCKS_EXCLUDED(mu_);

 private:
  struct Queued {
    std::string endpoint;
    OutgoingRequest request;
    absl::Time deadline;
    ReplyCallback done;
  };
  class Loop;

  DataClient(const DataClientOptions& options, BufferPool* pool, int event_fd);
  // Wakes the I/O thread (a write to the eventfd).
  void Wake();
  // Sends `q` on the caller's thread if the I/O thread is not holding the
  // sockets, nothing is queued before it, and its connection is open with
  // nothing in flight; false (and `q` untouched) otherwise.
  bool TrySendNow(Queued& q) ABSL_LOCKS_EXCLUDED(io_mu_, mu_);

  const DataClientOptions options_;
  BufferPool* const pool_;
  const int event_fd_;
  // Held by whoever touches a socket or loop_'s state: the I/O thread while
  // it is awake, a caller sending directly (TrySendNow).
  absl::Mutex io_mu_ ABSL_ACQUIRED_BEFORE(mu_);
  absl::Mutex mu_;
  std::deque<Queued> queue_ ABSL_GUARDED_BY(mu_);
  // Resets, in order with the sends around them.
  std::deque<std::pair<size_t, std::pair<std::string, absl::Status>>> resets_
      ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::unique_ptr<Loop> loop_;  // state of the sockets, under io_mu_
  std::thread thread_;
};

}  // namespace downpour

#endif  // DOWNPOUR_TRANSPORT_DATA_CLIENT_H_
