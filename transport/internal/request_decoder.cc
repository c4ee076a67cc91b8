#include "transport/internal/request_decoder.h"

#include <cstdint>

#include "absl/strings/str_cat.h"

namespace downpour {
namespace transport_internal {

absl::Status DecodeRequest(absl::Span<const Frame> frames,
                           size_t max_message_bytes, BufferPool* pool,
                           Buffer* key_scratch, Buffer* value_scratch,
                           IncomingMessage* request) {
  request->keys = {};
  request->values = {};
  if (frames.empty()) return absl::InvalidArgumentError("empty message");
  if (frames[0].size > static_cast<size_t>(INT32_MAX) ||
      !request->header.ParseFromArray(frames[0].data,
                                      static_cast<int>(frames[0].size))) {
    return absl::InvalidArgumentError(
        "malformed request: frame 0 is not a DataHeader");
  }
  if (frames.size() != 3) {
    return absl::InvalidArgumentError(
        absl::StrCat("malformed request: ", frames.size(),
                     " frames, expected 3 (header, keys, values)"));
  }
  size_t bytes = 0;
  for (const Frame& f : frames) bytes += f.size;
  if (bytes > max_message_bytes) {
    return absl::ResourceExhaustedError(
        absl::StrCat("request of ", bytes, " bytes exceeds the limit of ",
                     max_message_bytes, " bytes"));
  }
  if (frames[1].size % sizeof(Key) != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("malformed request: keys frame of ", frames[1].size,
                     " bytes is not a whole number of uint64 keys"));
  }
  if (frames[2].size % sizeof(float) != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("malformed request: values frame of ", frames[2].size,
                     " bytes is not a whole number of floats"));
  }
  request->keys =
      AlignedView<Key>(frames[1].data, frames[1].size, pool, key_scratch);
  request->values =
      AlignedView<float>(frames[2].data, frames[2].size, pool, value_scratch);
  return absl::OkStatus();
}

}  // namespace transport_internal
}  // namespace downpour
