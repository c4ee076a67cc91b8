#include "transport/internal/security.h"

#include <zmq.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <tuple>
#include <vector>

#include "absl/strings/str_cat.h"
#include "transport/internal/zmq_util.h"

namespace downpour {
namespace transport_internal {
namespace {

absl::Status SetString(void* socket, int option, const std::string& value,
                       const char* name) {
  if (zmq_setsockopt(socket, option, value.data(), value.size()) != 0) {
    return ErrnoStatus(absl::StrCat("set ", name));
  }
  return absl::OkStatus();
}

// Reads one whole multipart message as strings; empty if none is waiting.
std::vector<std::string> ReceiveAll(void* socket) {
  std::vector<std::string> frames;
  int more = 1;
  while (more) {
    zmq_msg_t m;
    zmq_msg_init(&m);
    const int flags = frames.empty() ? ZMQ_DONTWAIT : 0;
    if (zmq_msg_recv(&m, socket, flags) < 0) {
      zmq_msg_close(&m);
      break;
    }
    frames.emplace_back(static_cast<const char*>(zmq_msg_data(&m)),
                        zmq_msg_size(&m));
    more = zmq_msg_more(&m);
    zmq_msg_close(&m);
  }
  return frames;
}

std::string DescribeFailure(uint16_t event, uint32_t value) {
  std::string why;
  switch (event) {
    case ZMQ_EVENT_HANDSHAKE_FAILED_AUTH:
      why = absl::StrCat("the server refused the client's key (ZAP status ",
                         value, ")");
      break;
    case ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL:
      if (value == ZMQ_PROTOCOL_ERROR_ZMTP_MECHANISM_MISMATCH) {
        why = "one side uses CURVE and the other does not";
      } else if (value == ZMQ_PROTOCOL_ERROR_ZMTP_CRYPTOGRAPHIC) {
        why = "the cryptographic handshake failed";
      } else {
        why = absl::StrCat("protocol error 0x", absl::Hex(value));
      }
      break;
    default:
      // The peer hung up mid-handshake: what a CURVE server does to a
      // client without CURVE, before any error can be exchanged.
      why = absl::StrCat("the peer closed the connection (",
                         std::strerror(static_cast<int>(value)), ")");
      break;
  }
  return absl::StrCat("security handshake failed: ", why,
                      "; the cluster secrets differ, or one side has none "
                      "(--cluster_secret_file)");
}

}  // namespace

absl::Status ApplyCurveServer(void* socket, const ClusterAuth& auth) {
  if (!auth.enabled()) return absl::OkStatus();
  int one = 1;
  if (zmq_setsockopt(socket, ZMQ_CURVE_SERVER, &one, sizeof(one)) != 0) {
    return ErrnoStatus("set ZMQ_CURVE_SERVER");
  }
  if (auto s = SetString(socket, ZMQ_CURVE_SECRETKEY, auth.curve_secret_key(),
                         "ZMQ_CURVE_SECRETKEY");
      !s.ok()) {
    return s;
  }
  return SetString(socket, ZMQ_ZAP_DOMAIN, std::string("downpour"),
                   "ZMQ_ZAP_DOMAIN");
}

absl::Status ApplyCurveClient(void* socket, const ClusterAuth& auth) {
  if (!auth.enabled()) return absl::OkStatus();
  for (auto [option, value, name] :
       {std::make_tuple(ZMQ_CURVE_SERVERKEY, &auth.curve_public_key(),
                        "ZMQ_CURVE_SERVERKEY"),
        std::make_tuple(ZMQ_CURVE_PUBLICKEY, &auth.curve_public_key(),
                        "ZMQ_CURVE_PUBLICKEY"),
        std::make_tuple(ZMQ_CURVE_SECRETKEY, &auth.curve_secret_key(),
                        "ZMQ_CURVE_SECRETKEY")}) {
    if (auto s = SetString(socket, option, *value, name); !s.ok()) return s;
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<ZapHandler>> ZapHandler::Create(
    void* context, const ClusterAuth& auth) {
  uint8_t key[32];
  if (zmq_z85_decode(key, auth.curve_public_key().c_str()) == nullptr) {
    return absl::InvalidArgumentError("cluster public key is not Z85");
  }
  void* socket = zmq_socket(context, ZMQ_REP);
  if (socket == nullptr) return ErrnoStatus("ZAP socket");
  int zero = 0;
  zmq_setsockopt(socket, ZMQ_LINGER, &zero, sizeof(zero));
  // The address is fixed by the ZAP specification (RFC 27), one per context.
  if (zmq_bind(socket, "inproc://zeromq.zap.01") != 0) {
    absl::Status s = ErrnoStatus("bind ZAP handler");
    zmq_close(socket);
    return s;
  }
  return std::unique_ptr<ZapHandler>(new ZapHandler(
      socket, std::string(reinterpret_cast<const char*>(key), sizeof(key))));
}

ZapHandler::ZapHandler(void* socket, std::string cluster_public_key)
    : socket_(socket), cluster_public_key_(std::move(cluster_public_key)) {}

ZapHandler::~ZapHandler() { zmq_close(socket_); }

int ZapHandler::Serve() {
  int refused = 0;
  while (true) {
    std::vector<std::string> req = ReceiveAll(socket_);
    if (req.empty()) return refused;
    // version, request id, domain, address, routing id, mechanism,
    // credentials...
    const bool admit = req.size() >= 7 && req[0] == "1.0" &&
                       req[5] == "CURVE" && req[6] == cluster_public_key_;
    if (!admit) ++refused;
    const std::string request_id = req.size() > 1 ? req[1] : "";
    const std::string status = admit ? "200" : "400";
    const std::string text = admit ? "OK" : "client key is not the cluster's";
    const std::string reply[] = {"1.0", request_id, status, text, "", ""};
    for (size_t i = 0; i < 6; ++i) {
      zmq_send(socket_, reply[i].data(), reply[i].size(),
               i + 1 < 6 ? ZMQ_SNDMORE : 0);
    }
  }
}

absl::StatusOr<std::unique_ptr<HandshakeMonitor>> HandshakeMonitor::Create(
    void* context, void* socket, int hangups_to_report,
    bool watch_disconnects) {
  static std::atomic<uint64_t> next{0};
  const std::string address =
      absl::StrCat("inproc://downpour-handshake-", next.fetch_add(1));
  if (zmq_socket_monitor(
          socket, address.c_str(),
          ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL |
              ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL |
              ZMQ_EVENT_HANDSHAKE_FAILED_AUTH | ZMQ_EVENT_HANDSHAKE_SUCCEEDED |
              (watch_disconnects ? ZMQ_EVENT_DISCONNECTED : 0)) != 0) {
    return ErrnoStatus("monitor socket");
  }
  void* pair = zmq_socket(context, ZMQ_PAIR);
  int zero = 0;
  if (pair == nullptr ||
      zmq_setsockopt(pair, ZMQ_LINGER, &zero, sizeof(zero)) != 0 ||
      zmq_connect(pair, address.c_str()) != 0) {
    absl::Status s = ErrnoStatus("connect handshake monitor");
    if (pair != nullptr) zmq_close(pair);
    zmq_socket_monitor(socket, nullptr, 0);
    return s;
  }
  return std::unique_ptr<HandshakeMonitor>(
      new HandshakeMonitor(socket, pair, std::max(1, hangups_to_report)));
}

HandshakeMonitor::~HandshakeMonitor() {
  zmq_socket_monitor(monitored_, nullptr, 0);
  zmq_close(pair_);
}

std::optional<HandshakeMonitor::Failure> HandshakeMonitor::Next() {
  while (true) {
    std::vector<std::string> event = ReceiveAll(pair_);
    if (event.empty()) return std::nullopt;
    if (event.size() < 2 || event[0].size() < 6) continue;
    uint16_t id;
    uint32_t value;
    std::memcpy(&id, event[0].data(), sizeof(id));
    std::memcpy(&value, event[0].data() + sizeof(id), sizeof(value));
    if (id == ZMQ_EVENT_HANDSHAKE_SUCCEEDED) {
      hangups_ = 0;
      connected_ = true;
      continue;
    }
    if (id == ZMQ_EVENT_DISCONNECTED) {
      // Only a connection that was up counts: a refused handshake hangs
      // up too, and is reported above.
      if (connected_) disconnected_ = true;
      connected_ = false;
      continue;
    }
    if (id == ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL &&
        ++hangups_ < hangups_to_report_) {
      continue;
    }
    hangups_ = 0;
    return Failure{event[1], DescribeFailure(id, value)};
  }
}

}  // namespace transport_internal
}  // namespace downpour
