// Fuzzes the data plane's request framing (DecodeRequest): what a server's
// receive thread does with every message any peer sends, before the
// dispatcher sees it.
//
// Input: the message-size limit (1 byte: 64 B, 4 KiB or 1 MiB), the frame
// count (1 byte, 0..4), then per frame a misalignment flag (1 byte) and its
// bytes (a 2-byte length, then that many bytes; the last frame takes the
// rest). Checks, besides "no crash, no undefined behaviour": an accepted
// request has exactly its frames' keys and values, within the limit; a
// refused one has the documented code and no keys or values.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "common/buffer_pool.h"
#include "testing/fuzz/fuzz_input.h"
#include "transport/internal/request_decoder.h"

namespace {

[[noreturn]] void Fail(const std::string& what) {
  std::fprintf(stderr, "request_decoder_fuzzer: %s\n", what.c_str());
  std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace downpour;
  using transport_internal::Frame;
  FuzzInput in(data, size);
  const size_t max_bytes = in.Pick<size_t>({64, 4096, size_t{1} << 20});
  const size_t count = in.IntInRange(0, 4);
  // Each frame in its own allocation of exactly its size (plus the offset
  // that misaligns it), so that ASan sees any read past a frame.
  std::vector<std::unique_ptr<char[]>> storage;
  std::vector<Frame> frames;
  for (size_t i = 0; i < count; ++i) {
    const size_t offset = in.Bool() ? 1 : 0;
    const std::string bytes =
        i + 1 < count ? in.String(4096) : std::string(in.Rest());
    storage.emplace_back(new char[bytes.size() + offset]);
    std::memcpy(storage.back().get() + offset, bytes.data(), bytes.size());
    frames.push_back({storage.back().get() + offset, bytes.size()});
  }
  BufferPool pool;
  Buffer key_scratch, value_scratch;
  IncomingMessage request;
  const absl::Status s = transport_internal::DecodeRequest(
      frames, max_bytes, &pool, &key_scratch, &value_scratch, &request);
  if (!s.ok()) {
    if (s.code() != absl::StatusCode::kInvalidArgument &&
        s.code() != absl::StatusCode::kResourceExhausted) {
      Fail("unexpected code: " + s.ToString());
    }
    if (!request.keys.empty() || !request.values.empty()) {
      Fail("a refused request has keys or values");
    }
    return 0;
  }
  if (frames.size() != 3) Fail("accepted a request without three frames");
  if (frames[0].size + frames[1].size + frames[2].size > max_bytes) {
    Fail("accepted a request over the limit");
  }
  // (memcmp must not get the null data of an empty view.)
  if (request.keys.size() * sizeof(Key) != frames[1].size ||
      (frames[1].size > 0 &&
       std::memcmp(request.keys.data(), frames[1].data, frames[1].size) != 0)) {
    Fail("keys differ from the keys frame");
  }
  if (request.values.size() * sizeof(float) != frames[2].size ||
      (frames[2].size > 0 && std::memcmp(request.values.data(), frames[2].data,
                                         frames[2].size) != 0)) {
    Fail("values differ from the values frame");
  }
  if (reinterpret_cast<uintptr_t>(request.keys.data()) % alignof(Key) != 0 ||
      reinterpret_cast<uintptr_t>(request.values.data()) % alignof(float) !=
          0) {
    Fail("misaligned view");
  }
  return 0;
}
