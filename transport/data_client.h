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
//
// A caller that waits for one of many requests in flight may instead take
// the I/O thread's part itself (Pump): it receives the replies, runs their
// callbacks and sleeps in poll() on the sockets, holding io_mu_ meanwhile,
// while the I/O thread sleeps on its eventfd alone. Without the hand-offs
// through the I/O thread, a pipeline of small requests costs the client a
// quarter less CPU.
#ifndef DOWNPOUR_TRANSPORT_DATA_CLIENT_H_
#define DOWNPOUR_TRANSPORT_DATA_CLIENT_H_

#include <atomic>
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
  // Runs exactly once per Send, on the I/O thread or on a thread inside
  // Pump (with the sockets held either way). On success `status` is OK
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

  // What Pump did.
  enum class PumpResult {
    kPumped,   // this thread did the I/O until done() or the deadline
    kWaiting,  // another thread pumps; this one is counted as waiting (the
               // I/O thread takes the sockets back when that pump ends)
               // and must call StopWaiting() once its wait is over
    kNo,       // the client is stopping
  };
  // Lets the calling thread do the I/O thread's work (send what is queued,
  // receive replies and run their callbacks, expire deadlines) until
  // `done()` holds or `deadline` passes, sleeping in poll() on the sockets
  // meanwhile. A caller that waits for one of many requests in flight then
  // takes its replies itself, without the I/O thread's wake-ups and
  // hand-offs. While callers pump (and for kPumpLinger after the last one),
  // the I/O thread leaves the sockets alone, and any thread sends on them
  // directly. `done` runs under the client's locks and must not block or
  // call into the client.
  PumpResult Pump(const std::function<bool()>& done, absl::Time deadline)
      ABSL_LOCKS_EXCLUDED(io_mu_, mu_);
  void StopWaiting() ABSL_LOCKS_EXCLUDED(mu_);
  // Gives the sockets back to the I/O thread now if callers have them and
  // none pumps: for a reply that no pump will take (a wait that does not
  // pump, a request with a callback), which would otherwise wait out
  // kPumpLinger. Cheap when the I/O thread has them (one atomic load).
  void TakeBackSockets() ABSL_LOCKS_EXCLUDED(mu_);
  // How long the sockets stay with the callers after the last pump: a
  // pipelining caller pumps again sooner than this.
  static constexpr absl::Duration kPumpLinger = absl::Milliseconds(1);

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

  DataClient(const DataClientOptions& options, BufferPool* pool, int event_fd,
             int pump_fd);
  // Wakes the I/O thread (a write to the eventfd).
  void Wake();
  // Writes `fd`, an eventfd.
  static void Signal(int fd);
  // The I/O thread's choice before it sleeps: true to leave the sockets to
  // the callers. Takes them back once nobody pumps and either a thread
  // waits for a pump that ended or kPumpLinger has passed.
  bool ShouldPark() ABSL_LOCKS_EXCLUDED(mu_);
  // Sets callers_have_sockets_ and its hint together.
  void SetCallersHaveSockets(bool callers) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Sends `q` on the caller's thread if the I/O thread is not holding the
  // sockets, nothing is queued before it, and its connection is open with
  // nothing in flight (or callers have the sockets); false (and `q`
  // untouched) otherwise.
  bool TrySendNow(Queued& q) ABSL_LOCKS_EXCLUDED(io_mu_, mu_);

  const DataClientOptions options_;
  BufferPool* const pool_;
  const int event_fd_;
  // Wakes a pumping caller: what is queued while a caller pumps is sent by
  // it.
  const int pump_fd_;
  // Held by whoever touches a socket or loop_'s state: the I/O thread while
  // it is awake, a caller sending directly (TrySendNow), a caller pumping
  // (for the whole of Pump, asleep in poll() too).
  absl::Mutex io_mu_ ABSL_ACQUIRED_BEFORE(mu_);
  absl::Mutex mu_;
  std::deque<Queued> queue_ ABSL_GUARDED_BY(mu_);
  // Resets, in order with the sends around them.
  std::deque<std::pair<size_t, std::pair<std::string, absl::Status>>> resets_
      ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  // Who sleeps on the sockets: the I/O thread, or callers in Pump (one at a
  // time, holding io_mu_). With callers, a request may be sent directly on
  // a connection with others in flight: every pump, and the I/O thread
  // when it takes the sockets back, reads every socket to empty before it
  // sleeps on their descriptors.
  bool callers_have_sockets_ ABSL_GUARDED_BY(mu_) = false;
  // callers_have_sockets_, for a look without the lock: stale at worst for
  // a request that races a pump's start, whose reply then waits at most
  // kPumpLinger after the pump.
  std::atomic<bool> callers_have_sockets_hint_{false};
  bool pumping_ ABSL_GUARDED_BY(mu_) = false;
  int waiters_ ABSL_GUARDED_BY(mu_) = 0;  // kWaiting callers
  // TakeBackSockets was called during the pump.
  bool hand_back_asked_ ABSL_GUARDED_BY(mu_) = false;
  absl::Time last_pump_ ABSL_GUARDED_BY(mu_);
  std::unique_ptr<Loop> loop_;  // state of the sockets, under io_mu_
  std::thread thread_;
};

}  // namespace downpour

#endif  // DOWNPOUR_TRANSPORT_DATA_CLIENT_H_
