// Data-plane message frames, independent of the socket library.
//
// A request is [DataHeader][keys][values]; a reply is [DataHeader][values].
// Keys are raw uint64 and values raw float32 in host (little-endian) order.
// Payloads are either borrowed (the caller keeps the memory alive until the
// send completes: zero-copy) or owned pooled Buffers.
#ifndef DOWNPOUR_TRANSPORT_FRAMES_H_
#define DOWNPOUR_TRANSPORT_FRAMES_H_

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <utility>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "common/buffer_pool.h"
#include "common/error_reason.h"
#include "common/types.h"
#include "proto/downpour.pb.h"

namespace downpour {

// Whether an operation carries values to the server, and whether its reply
// carries values back.
inline bool OpWrites(proto::Op op) {
  return op == proto::PUT || op == proto::ADD || op == proto::PUSH ||
         op == proto::PUSH_PULL;
}
inline bool OpReads(proto::Op op) {
  return op == proto::GET || op == proto::PULL || op == proto::PUSH_PULL;
}

// Index of the first value that is not finite (NaN or infinity), or
// values.size(): what the SDK and the server check of a push's values.
// Two floats per 64-bit word, eight per step and no branch per value: a
// gradient of millions of floats is checked at memory speed.
inline size_t FirstNonFinite(absl::Span<const float> values) {
  // A float is not finite when its exponent bits are all set; adding one
  // to the exponent then carries into the sign bit of its half.
  constexpr uint64_t kExp = 0x7f8000007f800000ull;
  constexpr uint64_t kOne = 0x0080000000800000ull;
  constexpr uint64_t kSign = 0x8000000080000000ull;
  const float* v = values.data();
  const size_t n = values.size();
  size_t i = 0;
  for (; i + 1024 <= n; i += 1024) {
    uint64_t acc = 0;
    for (size_t j = 0; j < 1024; j += 8) {
      uint64_t w[4];
      std::memcpy(w, v + i + j, sizeof(w));
      acc |= ((w[0] & kExp) + kOne) | ((w[1] & kExp) + kOne) |
             ((w[2] & kExp) + kOne) | ((w[3] & kExp) + kOne);
    }
    if ((acc & kSign) != 0) break;  // the culprit is in this block
  }
  for (; i < n; ++i) {
    if (!std::isfinite(v[i])) return i;
  }
  return n;
}

// A reply's outcome in its header: code, message and typed reason
// (common/error_reason.h), both ways.
inline void SetReplyStatus(const absl::Status& status,
                           proto::DataHeader* header) {
  header->set_status_code(static_cast<int>(status.code()));
  header->set_status_message(std::string(status.message()));
  header->set_error_reason(static_cast<uint32_t>(ReasonOf(status)));
}
inline absl::Status ReplyStatus(const proto::DataHeader& header) {
  if (header.status_code() == 0) return absl::OkStatus();
  return WithReason(
      absl::Status(static_cast<absl::StatusCode>(header.status_code()),
                   header.status_message()),
      ReasonFromWire(header.error_reason()));
}

// An outgoing payload frame. Move-only. A borrowed payload's release
// callback runs exactly once: when the transport lets go of the bytes, when
// someone takes it (TakeReleaseCallback), or else when the Payload is
// destroyed or assigned over (a reply dropped before it was sent must not
// leave its memory pinned).
class Payload {
 public:
  Payload() = default;
  Payload(Payload&& other) noexcept { *this = std::move(other); }
  Payload& operator=(Payload&& other) noexcept {
    if (this != &other) {
      Reset();
      borrowed_ = std::exchange(other.borrowed_, nullptr);
      owned_ = std::move(other.owned_);
      size_ = std::exchange(other.size_, 0);
      on_release_ = std::exchange(other.on_release_, nullptr);
    }
    return *this;
  }
  Payload(const Payload&) = delete;
  Payload& operator=(const Payload&) = delete;
  ~Payload() { Reset(); }

  // Zero-copy: `data` must stay valid until `on_release` runs (on any
  // thread), which happens once the transport no longer references it: after
  // the bytes were written to the socket, or after the message was dropped.
  static Payload Borrow(const void* data, size_t size,
                        std::function<void()> on_release = nullptr) {
    Payload p;
    p.borrowed_ = data;
    p.size_ = size;
    p.on_release_ = std::move(on_release);
    return p;
  }
  static Payload Own(Buffer buffer) {
    Payload p;
    p.size_ = buffer.size();
    p.owned_ = std::move(buffer);
    return p;
  }

  const void* data() const {
    return owned_.data() != nullptr ? owned_.data() : borrowed_;
  }
  size_t size() const { return size_; }
  bool owned() const { return owned_.data() != nullptr; }
  // Gives the pooled block away (for a zero-copy send that frees it later).
  PoolBlock* DetachOwned() { return owned_.Detach(); }
  std::function<void()> TakeReleaseCallback() {
    return std::exchange(on_release_, nullptr);
  }

 private:
  void Reset() {
    if (auto release = TakeReleaseCallback()) release();
    owned_ = Buffer();
    borrowed_ = nullptr;
    size_ = 0;
  }

  const void* borrowed_ = nullptr;
  Buffer owned_;
  size_t size_ = 0;
  std::function<void()> on_release_;
};

struct OutgoingRequest {
  proto::DataHeader header;
  Payload keys;
  Payload values;
};

struct OutgoingReply {
  proto::DataHeader header;
  Payload values;
  // Server side: set by the handler to answer later. Nothing is sent now;
  // the handler answers with DataServer::SendDeferred and the request's
  // IncomingMessage::reply_token (BSP PushPull: the values exist only once
  // the round's last gradient has arrived).
  bool deferred = false;
};

// Server side: the reply to a request that was deferred, named by the
// IncomingMessage::reply_token of that request.
struct DeferredReply {
  uint64_t reply_token = 0;
  OutgoingReply reply;
};

// A received request's key and value frames, kept past the handler that
// received it (DataServer::Retain), e.g. to forward them to a replica
// without copying: Payload::Borrow(values.data(), ..., [keep] {}) with a
// copy of the shared_ptr keeps them alive until that send completes.
// Immutable; any thread may read it and drop its reference.
class RetainedRequest {
 public:
  virtual ~RetainedRequest() = default;
  absl::Span<const Key> keys;
  absl::Span<const float> values;
};

// A received message's payloads, aligned for direct use. Valid only during
// the callback that receives it.
struct IncomingMessage {
  proto::DataHeader header;
  absl::Span<const Key> keys;      // empty in replies
  absl::Span<const float> values;  // empty when the frame was empty
  // Server side: names this request for a deferred reply (never 0).
  uint64_t reply_token = 0;
};

}  // namespace downpour

#endif  // DOWNPOUR_TRANSPORT_FRAMES_H_
