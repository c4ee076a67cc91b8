// CURVE security for the data plane (see common/auth.h for the model).
// Private to transport/.
#ifndef DOWNPOUR_TRANSPORT_INTERNAL_SECURITY_H_
#define DOWNPOUR_TRANSPORT_INTERNAL_SECURITY_H_

#include <cstdint>
#include <optional>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/auth.h"

namespace downpour {
namespace transport_internal {

// Makes `socket` a CURVE server with the cluster's key pair. Call before
// bind. No-op when auth is off.
absl::Status ApplyCurveServer(void* socket, const ClusterAuth& auth);
// Makes `socket` a CURVE client presenting the cluster's key pair and
// expecting the cluster's server key. Call before connect. No-op when off.
absl::Status ApplyCurveClient(void* socket, const ClusterAuth& auth);

// The ZAP handler of one ZeroMQ context: without it a CURVE server admits
// any client that knows the (public) server key; with it only clients whose
// public key is the cluster's, i.e. who hold the secret. Owned and polled by
// the server's receive thread; it must exist before the server socket binds.
class ZapHandler {
 public:
  static absl::StatusOr<std::unique_ptr<ZapHandler>> Create(
      void* context, const ClusterAuth& auth);
  ~ZapHandler();
  void* socket() const { return socket_; }  // poll for ZMQ_POLLIN
  // Answers every waiting request; returns how many it refused.
  int Serve();

 private:
  ZapHandler(void* socket, std::string cluster_public_key);
  void* socket_;
  const std::string cluster_public_key_;  // 32 raw bytes
};

// Reports failed security handshakes on one socket: a peer with a wrong
// secret, or one with security where the other side has none.
class HandshakeMonitor {
 public:
  struct Failure {
    std::string endpoint;     // the peer's address as ZeroMQ names it
    std::string description;  // why, in words
  };
  // `socket` must outlive the monitor. A peer that hangs up during the
  // handshake without saying why is reported only after `hangups_to_report`
  // such hang-ups in a row with no handshake succeeding in between: a
  // connecting client uses 2, since one hang-up may be a server shutting
  // down while the second (ZeroMQ reconnects within ~100 ms) is the refusal
  // a server with CURVE gives a client without it. A refusal with a reason
  // (ZAP denial, mechanism mismatch, bad cryptography) is reported at once.
  // `watch_disconnects`: also notice an established connection breaking
  // (see TakeDisconnect), for a client that reports its peer unreachable.
  static absl::StatusOr<std::unique_ptr<HandshakeMonitor>> Create(
      void* context, void* socket, int hangups_to_report = 1,
      bool watch_disconnects = false);
  ~HandshakeMonitor();
  void* socket() const { return pair_; }  // poll for ZMQ_POLLIN
  // The next failure to report, if one is waiting.
  std::optional<Failure> Next();
  // Whether an established connection broke since the last call (events
  // are read by Next; call it first).
  bool TakeDisconnect() { return std::exchange(disconnected_, false); }

 private:
  HandshakeMonitor(void* monitored, void* pair, int hangups_to_report)
      : monitored_(monitored),
        pair_(pair),
        hangups_to_report_(hangups_to_report) {}
  void* monitored_;
  void* pair_;
  const int hangups_to_report_;
  int hangups_ = 0;            // in a row, since the last successful handshake
  bool connected_ = false;     // a handshake succeeded since the last break
  bool disconnected_ = false;  // a connection broke since TakeDisconnect
};

}  // namespace transport_internal
}  // namespace downpour

#endif  // DOWNPOUR_TRANSPORT_INTERNAL_SECURITY_H_
