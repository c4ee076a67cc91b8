// ZeroMQ plumbing shared by DataServer and DataClient. Nothing outside
// transport/ includes this.
#ifndef DOWNPOUR_TRANSPORT_INTERNAL_ZMQ_UTIL_H_
#define DOWNPOUR_TRANSPORT_INTERNAL_ZMQ_UTIL_H_

#include <zmq.h>

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "common/buffer_pool.h"
#include "transport/frames.h"
#include "transport/internal/request_decoder.h"  // AlignedView

namespace downpour {
namespace transport_internal {

// A received multipart message. Reuses its zmq_msg_t slots across calls.
class MultipartMessage {
 public:
  MultipartMessage() = default;
  ~MultipartMessage() { Clear(); }
  MultipartMessage(const MultipartMessage&) = delete;
  MultipartMessage& operator=(const MultipartMessage&) = delete;

  // Receives one whole message. Returns false with errno EAGAIN when none is
  // waiting (flags = ZMQ_DONTWAIT), or false on another error.
  bool Receive(void* socket, int flags);
  void Clear();
  size_t size() const { return count_; }
  zmq_msg_t* frame(size_t i) { return &frames_[i]; }
  const char* data(size_t i) {
    return static_cast<const char*>(zmq_msg_data(&frames_[i]));
  }
  size_t frame_size(size_t i) { return zmq_msg_size(&frames_[i]); }
  size_t total_bytes(size_t first);

 private:
  std::vector<zmq_msg_t> frames_;
  size_t count_ = 0;
};

// Sends `bytes` copied (small frames).
bool SendCopy(void* socket, const void* data, size_t size, int flags);
// Sends a payload without copying it: an owned Buffer is handed to ZeroMQ,
// which returns it to its pool once sent; a borrowed one is referenced.
bool SendPayload(void* socket, Payload* payload, int flags);

// Opens a socket with the options every data-plane socket uses.
void* OpenSocket(void* context, int type, size_t max_message_bytes);

// The descriptor that signals a change of `socket`'s state (ZMQ_FD). It
// signals only what happens after the socket's last use, so a thread sleeps
// on it only after a receive found the socket empty.
int DescriptorOf(void* socket);

absl::Status ErrnoStatus(absl::string_view what);

}  // namespace transport_internal
}  // namespace downpour

#endif  // DOWNPOUR_TRANSPORT_INTERNAL_ZMQ_UTIL_H_
