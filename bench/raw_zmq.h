// The raw ZeroMQ baseline of the benchmarks: a DEALER (this process) and a
// ROUTER (a forked child) over loopback moving the same bytes as the
// parameter server does, with reused buffers and zero-copy sends, so that
// every Downpour figure can be read against what the wire itself does on
// the same machine in the same run.
//
//   std::string endpoint = StartRawServer();   // before any thread starts
//   RawClient raw(endpoint);
//   double bps = raw.Run(1 << 20, /*pull=*/false, /*depth=*/2, 100);
//   ...
//   raw.Quit();
//
// Thread-compatible: one RawClient per thread.
#ifndef DOWNPOUR_BENCH_RAW_ZMQ_H_
#define DOWNPOUR_BENCH_RAW_ZMQ_H_

#include <cstddef>
#include <string>
#include <vector>

namespace downpour {
namespace bench {

// Forks the ROUTER process and returns its endpoint ("" on failure). Call
// before any thread starts. The child ends with its parent, or on Quit().
std::string StartRawServer(int* child_pid);

class RawClient {
 public:
  explicit RawClient(const std::string& endpoint);
  ~RawClient();
  RawClient(const RawClient&) = delete;
  RawClient& operator=(const RawClient&) = delete;

  // Tells the peer process to exit (once, at the end of the run).
  void Quit();

  // Bytes per second moving `size` bytes per request in one frame (push:
  // the request carries them, the reply is 1 byte; pull: a 9-byte request,
  // the reply carries them), `depth` in flight, `iters` requests.
  double Run(size_t size, bool pull, int depth, int iters);

  // Requests per second, each a 9-byte frame and then `request_bytes` in a
  // second frame (none when 0), answered with `reply_bytes` (at least 1);
  // `depth` in flight, `iters` requests. What a Downpour request of the
  // same payloads moves, its header aside.
  double Messages(size_t request_bytes, size_t reply_bytes, int depth,
                  int iters);

  // Round-trip times in microseconds, one request at a time, of the
  // messages above: at most `max_ops` of them within `seconds`.
  std::vector<double> Latencies(size_t request_bytes, size_t reply_bytes,
                                double seconds, int max_ops);

 private:
  void SendMessage(size_t request_bytes, size_t reply_bytes);
  void Receive();
  void Grow(size_t size);

  void* ctx_;
  void* s_;
  std::vector<char> buf_;
};

}  // namespace bench
}  // namespace downpour

#endif  // DOWNPOUR_BENCH_RAW_ZMQ_H_
