#include "transport/internal/zmq_util.h"

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "transport/internal/tsan_annotations.h"

namespace downpour {
namespace transport_internal {

bool MultipartMessage::Receive(void* socket, int flags) {
  Clear();
  while (true) {
    if (count_ == frames_.size()) frames_.emplace_back();
    zmq_msg_t* m = &frames_[count_];
    zmq_msg_init(m);
    if (zmq_msg_recv(m, socket, count_ == 0 ? flags : 0) < 0) {
      zmq_msg_close(m);
      if (count_ == 0) return false;
      // A multipart message arrives whole, so this is the socket closing.
      return false;
    }
    ++count_;
    if (!zmq_msg_more(m)) return true;
  }
}

void MultipartMessage::Clear() {
  for (size_t i = 0; i < count_; ++i) zmq_msg_close(&frames_[i]);
  count_ = 0;
}

size_t MultipartMessage::total_bytes(size_t first) {
  size_t total = 0;
  for (size_t i = first; i < count_; ++i) total += zmq_msg_size(&frames_[i]);
  return total;
}

bool SendCopy(void* socket, const void* data, size_t size, int flags) {
  return zmq_send(socket, data, size, flags) >= 0;
}

namespace {
void NoFree(void*, void*) {}
// ZeroMQ runs these on its I/O thread once it is done with the bytes.
void RunRelease(void*, void* hint) {
  DP_TSAN_ACQUIRE(hint);
  auto* fn = static_cast<std::function<void()>*>(hint);
  (*fn)();
  delete fn;
}

void ReturnToPool(void* data, void* hint) {
  DP_TSAN_ACQUIRE(hint);
  BufferPool::FreeForZmq(data, hint);
}
}  // namespace

bool SendPayload(void* socket, Payload* payload, int flags) {
  zmq_msg_t msg;
  const size_t size = payload->size();
  if (size == 0) {
    zmq_msg_init(&msg);
    if (auto release = payload->TakeReleaseCallback()) release();
  } else if (size <= 256) {
    // Tiny frames are cheaper to copy than to reference (an owned buffer
    // then goes back to its pool on this thread, not on ZeroMQ's).
    zmq_msg_init_size(&msg, size);
    std::memcpy(zmq_msg_data(&msg), payload->data(), size);
    *payload = Payload();
  } else if (payload->owned()) {
    void* data = const_cast<void*>(payload->data());
    PoolBlock* block = payload->DetachOwned();
    DP_TSAN_RELEASE(block);
    zmq_msg_init_data(&msg, data, size, &ReturnToPool, block);
  } else if (auto release = payload->TakeReleaseCallback()) {
    auto* hint = new std::function<void()>(std::move(release));
    DP_TSAN_RELEASE(hint);
    zmq_msg_init_data(&msg, const_cast<void*>(payload->data()), size,
                      &RunRelease, hint);
  } else {
    zmq_msg_init_data(&msg, const_cast<void*>(payload->data()), size, &NoFree,
                      nullptr);
  }
  if (zmq_msg_send(&msg, socket, flags) < 0) {
    zmq_msg_close(&msg);  // runs the free callback for an owned buffer
    return false;
  }
  return true;
}

void* OpenSocket(void* context, int type, size_t max_message_bytes) {
  void* s = zmq_socket(context, type);
  if (s == nullptr) return nullptr;
  int zero = 0;
  // Unlimited queues: a client bounds its own in-flight window, and a ROUTER
  // at its high-water mark would silently drop replies.
  zmq_setsockopt(s, ZMQ_SNDHWM, &zero, sizeof(zero));
  zmq_setsockopt(s, ZMQ_RCVHWM, &zero, sizeof(zero));
  zmq_setsockopt(s, ZMQ_LINGER, &zero, sizeof(zero));
  int64_t max = static_cast<int64_t>(2 * max_message_bytes + (1 << 16));
  zmq_setsockopt(s, ZMQ_MAXMSGSIZE, &max, sizeof(max));
  int buf = 4 << 20;
  zmq_setsockopt(s, ZMQ_SNDBUF, &buf, sizeof(buf));
  zmq_setsockopt(s, ZMQ_RCVBUF, &buf, sizeof(buf));
  return s;
}

int DescriptorOf(void* socket) {
  int fd = -1;
  size_t len = sizeof(fd);
  zmq_getsockopt(socket, ZMQ_FD, &fd, &len);
  return fd;
}

absl::Status ErrnoStatus(absl::string_view what) {
  return absl::UnavailableError(
      absl::StrCat(what, ": ", zmq_strerror(zmq_errno())));
}

}  // namespace transport_internal
}  // namespace downpour
