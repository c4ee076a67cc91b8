#include "bench/raw_zmq.h"

#include <signal.h>
#include <sys/prctl.h>
#include <unistd.h>
#include <zmq.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "absl/time/clock.h"
#include "common/malloc_tuning.h"

namespace downpour {
namespace bench {
namespace {

void NoFree(void*, void*) {}

// The child: a ROUTER socket. A request whose first frame is 'P' and 8
// bytes of size asks for a reply of that size; any other gets a 1-byte
// reply. Frames after the first are read and dropped.
[[noreturn]] void RawServer(int endpoint_pipe) {
  TuneAllocatorForLargeMessages();
  void* ctx = zmq_ctx_new();
  // Ends with the parent (or on its 'Q' message).
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  void* s = zmq_socket(ctx, ZMQ_ROUTER);
  zmq_bind(s, "tcp://127.0.0.1:*");
  char ep[256];
  size_t len = sizeof(ep);
  zmq_getsockopt(s, ZMQ_LAST_ENDPOINT, ep, &len);
  ssize_t unused = write(endpoint_pipe, ep, strlen(ep) + 1);
  (void)unused;
  close(endpoint_pipe);
  std::vector<char> big(size_t{256} << 20);
  std::memset(big.data(), 1, big.size());
  while (true) {
    zmq_msg_t id, body;
    zmq_msg_init(&id);
    zmq_msg_init(&body);
    if (zmq_msg_recv(&id, s, 0) < 0) break;
    zmq_msg_recv(&body, s, 0);
    const char* d = static_cast<const char*>(zmq_msg_data(&body));
    const bool quit = zmq_msg_size(&body) == 1 && d[0] == 'Q';
    size_t reply = 1;
    if (zmq_msg_size(&body) == 9 && d[0] == 'P') std::memcpy(&reply, d + 1, 8);
    while (zmq_msg_more(&body)) {
      zmq_msg_close(&body);
      zmq_msg_init(&body);
      zmq_msg_recv(&body, s, 0);
    }
    zmq_msg_send(&id, s, ZMQ_SNDMORE);
    zmq_msg_t r;
    zmq_msg_init_data(&r, big.data(), std::min(reply, big.size()), NoFree,
                      nullptr);
    zmq_msg_send(&r, s, 0);
    zmq_msg_close(&body);
    if (quit) break;
  }
  _exit(0);
}

}  // namespace

std::string StartRawServer(int* child_pid) {
  int fds[2];
  if (pipe(fds) != 0) return "";
  const pid_t child = fork();
  if (child == 0) {
    close(fds[0]);
    RawServer(fds[1]);
  }
  close(fds[1]);
  char ep[256] = {0};
  const ssize_t n = read(fds[0], ep, sizeof(ep) - 1);
  close(fds[0]);
  *child_pid = child;
  return n > 0 ? std::string(ep) : "";
}

RawClient::RawClient(const std::string& endpoint) {
  ctx_ = zmq_ctx_new();
  s_ = zmq_socket(ctx_, ZMQ_DEALER);
  int timeout = 60000;  // a lost peer fails the run instead of hanging it
  zmq_setsockopt(s_, ZMQ_RCVTIMEO, &timeout, sizeof(timeout));
  zmq_connect(s_, endpoint.c_str());
}

RawClient::~RawClient() {
  zmq_close(s_);
  zmq_ctx_term(ctx_);
}

void RawClient::Quit() {
  zmq_send(s_, "Q", 1, 0);
  // The peer may exit before its answer is written: wait briefly, and do
  // not mind if none comes.
  int timeout = 1000;
  zmq_setsockopt(s_, ZMQ_RCVTIMEO, &timeout, sizeof(timeout));
  zmq_msg_t m;
  zmq_msg_init(&m);
  zmq_msg_recv(&m, s_, 0);
  zmq_msg_close(&m);
}

void RawClient::Grow(size_t size) {
  if (buf_.size() < size) {
    buf_.resize(size);
    std::memset(buf_.data(), 2, size);
  }
}

void RawClient::Receive() {
  zmq_msg_t m;
  zmq_msg_init(&m);
  if (zmq_msg_recv(&m, s_, 0) < 0) {
    std::fprintf(stderr, "raw zmq peer did not answer\n");
    std::exit(1);
  }
  zmq_msg_close(&m);
}

void RawClient::SendMessage(size_t request_bytes, size_t reply_bytes) {
  char req[9] = {'P'};
  std::memcpy(req + 1, &reply_bytes, 8);
  zmq_send(s_, req, 9, request_bytes > 0 ? ZMQ_SNDMORE : 0);
  if (request_bytes == 0) return;
  zmq_msg_t m;
  if (request_bytes <= 256) {
    // As Downpour's transport: tiny frames are copied, not referenced.
    zmq_send(s_, buf_.data(), request_bytes, 0);
    return;
  }
  zmq_msg_init_data(&m, buf_.data(), request_bytes, NoFree, nullptr);
  zmq_msg_send(&m, s_, 0);
}

double RawClient::Run(size_t size, bool pull, int depth, int iters) {
  Grow(size);
  auto send = [&] {
    zmq_msg_t m;
    if (pull) {
      char req[9] = {'P'};
      std::memcpy(req + 1, &size, 8);
      zmq_send(s_, req, 9, 0);
    } else {
      zmq_msg_init_data(&m, buf_.data(), size, NoFree, nullptr);
      zmq_msg_send(&m, s_, 0);
    }
  };
  for (int i = 0; i < depth; ++i) send();  // warm-up
  for (int i = 0; i < depth; ++i) Receive();
  const absl::Time start = absl::Now();
  int sent = 0, got = 0;
  for (; sent < std::min(depth, iters); ++sent) send();
  while (got < iters) {
    Receive();
    ++got;
    if (sent < iters) {
      send();
      ++sent;
    }
  }
  return size * static_cast<double>(iters) /
         absl::ToDoubleSeconds(absl::Now() - start);
}

double RawClient::Messages(size_t request_bytes, size_t reply_bytes, int depth,
                           int iters) {
  Grow(request_bytes);
  for (int i = 0; i < depth; ++i) SendMessage(request_bytes, reply_bytes);
  for (int i = 0; i < depth; ++i) Receive();  // warm-up
  const absl::Time start = absl::Now();
  int sent = 0, got = 0;
  for (; sent < std::min(depth, iters); ++sent) {
    SendMessage(request_bytes, reply_bytes);
  }
  while (got < iters) {
    Receive();
    ++got;
    if (sent < iters) {
      SendMessage(request_bytes, reply_bytes);
      ++sent;
    }
  }
  return iters / absl::ToDoubleSeconds(absl::Now() - start);
}

std::vector<double> RawClient::Latencies(size_t request_bytes,
                                         size_t reply_bytes, double seconds,
                                         int max_ops) {
  Grow(request_bytes);
  for (int i = 0; i < 200; ++i) {
    SendMessage(request_bytes, reply_bytes);
    Receive();
  }
  std::vector<double> us;
  const absl::Time stop = absl::Now() + absl::Seconds(seconds);
  while (static_cast<int>(us.size()) < max_ops && absl::Now() < stop) {
    const absl::Time a = absl::Now();
    SendMessage(request_bytes, reply_bytes);
    Receive();
    us.push_back(absl::ToDoubleMicroseconds(absl::Now() - a));
  }
  return us;
}

}  // namespace bench
}  // namespace downpour
