// Fuzzes the IDX parser behind LoadFashionMnist (ParseIdx) with any image
// and label contents.
//
// Input: 4 bytes (little-endian) giving the length of the images part, the
// images part, then the labels. Checks, besides "no crash, no undefined
// behaviour": a parsed data set is consistent (features = examples x dim,
// pixels in [0, 1], labels in [0, 10)), and an error is kDataLoss.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "absl/strings/string_view.h"
#include "models/dataset.h"

namespace {

[[noreturn]] void Fail(const char* what) {
  std::fprintf(stderr, "idx_fuzzer: %s\n", what);
  std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 4) return 0;
  uint32_t images_size;
  std::memcpy(&images_size, data, 4);
  const absl::string_view rest(reinterpret_cast<const char*>(data) + 4,
                               size - 4);
  const size_t split = std::min<size_t>(images_size, rest.size());
  auto parsed = downpour::ParseIdx(rest.substr(0, split), rest.substr(split),
                                   "images", "labels");
  if (!parsed.ok()) {
    if (parsed.status().code() != absl::StatusCode::kDataLoss) {
      Fail(parsed.status().ToString().c_str());
    }
    return 0;
  }
  const downpour::Dataset& d = *parsed;
  if (d.num_examples < 0 || d.dim <= 0 || d.num_classes != 10 ||
      d.features.size() != static_cast<size_t>(d.num_examples) * d.dim ||
      d.labels.size() != static_cast<size_t>(d.num_examples)) {
    Fail("inconsistent shape");
  }
  for (float f : d.features) {
    if (!(f >= 0 && f <= 1)) Fail("pixel outside [0, 1]");
  }
  for (int32_t l : d.labels) {
    if (l < 0 || l >= 10) Fail("label outside [0, 10)");
  }
  return 0;
}
