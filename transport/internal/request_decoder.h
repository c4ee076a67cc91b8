// Decoding a data-plane request from its frames, without ZeroMQ: what
// DataServer does with every message it receives (after the sender's
// identity frame), and what the request fuzzer drives
// (transport/request_decoder_fuzzer.cc). Nothing outside transport/ includes
// this, except that fuzzer's sibling in server/.
#ifndef DOWNPOUR_TRANSPORT_INTERNAL_REQUEST_DECODER_H_
#define DOWNPOUR_TRANSPORT_INTERNAL_REQUEST_DECODER_H_

#include <cstdint>
#include <cstring>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "common/buffer_pool.h"
#include "transport/frames.h"

namespace downpour {
namespace transport_internal {

// One received frame's bytes (borrowed).
struct Frame {
  const char* data = nullptr;
  size_t size = 0;
};

// Returns a span over a frame's bytes as T, copying into `scratch` when the
// frame is not aligned for T (small ZeroMQ messages live inside the message
// struct and have no alignment guarantee). A trailing partial T is ignored.
template <typename T>
absl::Span<const T> AlignedView(const char* data, size_t bytes,
                                BufferPool* pool, Buffer* scratch) {
  const size_t n = bytes / sizeof(T);
  if (n == 0) return {};
  if (reinterpret_cast<uintptr_t>(data) % alignof(T) == 0) {
    return absl::Span<const T>(reinterpret_cast<const T*>(data), n);
  }
  *scratch = pool->Acquire(bytes);
  std::memcpy(scratch->data(), data, bytes);
  return absl::Span<const T>(reinterpret_cast<const T*>(scratch->data()), n);
}

// Decodes the frames [header][keys][values] of one request. On OK,
// `request` holds the parsed header and views of the keys and values, valid
// while `frames` and the scratch buffers are (misaligned frames are copied
// into *key_scratch / *value_scratch, taken from `pool`); reply_token is
// left alone. Errors, checked in this order (the first one wins):
//   kInvalidArgument   no frame ("empty message"), a first frame that is not
//                      a DataHeader, not exactly three frames, a keys frame
//                      that is not a whole number of uint64 keys, a values
//                      frame that is not a whole number of floats
//   kResourceExhausted the frames add up to more than max_message_bytes
//                      (checked before the frame sizes)
// On error `request->header` holds as much as was parsed (its request_id
// names the reply) and the views are empty. Does not check what the header
// asks for: that is the server's dispatcher's job.
absl::Status DecodeRequest(absl::Span<const Frame> frames,
                           size_t max_message_bytes, BufferPool* pool,
                           Buffer* key_scratch, Buffer* value_scratch,
                           IncomingMessage* request);

}  // namespace transport_internal
}  // namespace downpour

#endif  // DOWNPOUR_TRANSPORT_INTERNAL_REQUEST_DECODER_H_
