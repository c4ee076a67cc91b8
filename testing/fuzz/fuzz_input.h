// Structured values from a fuzzer's bytes, in the manner of LLVM's
// FuzzedDataProvider but portable to GCC (the fuzz targets also build as
// regression tests without clang). Reading past the end yields zeros and
// empty strings, never an error, so every byte string is a valid input.
//
//   FuzzInput in(data, size);
//   const int op = in.IntInRange(0, 7);
//   const std::string name = in.String(32);
//   const std::string_view rest = in.Rest();
//
// Not thread-safe; borrows the bytes.
#ifndef DOWNPOUR_TESTING_FUZZ_FUZZ_INPUT_H_
#define DOWNPOUR_TESTING_FUZZ_FUZZ_INPUT_H_

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <iterator>
#include <string>
#include <string_view>

namespace downpour {

class FuzzInput {
 public:
  FuzzInput(const uint8_t* data, size_t size)
      : data_(reinterpret_cast<const char*>(data)), size_(size) {}

  bool empty() const { return pos_ >= size_; }
  size_t remaining() const { return size_ - pos_; }

  // A value in [lo, hi] from as few bytes as the range needs.
  // REQUIRES: lo <= hi.
  uint64_t IntInRange(uint64_t lo, uint64_t hi) {
    const uint64_t span = hi - lo;
    uint64_t v = 0;
    for (uint64_t bits = 0; bits < 64 && (span >> bits) != 0; bits += 8) {
      v = (v << 8) | Byte();
    }
    return span == UINT64_MAX ? v : lo + v % (span + 1);
  }
  bool Bool() { return (Byte() & 1) != 0; }
  template <typename T>
  T Raw() {
    T v{};
    const size_t n = std::min(sizeof(T), remaining());
    if (n > 0) std::memcpy(&v, data_ + pos_, n);
    pos_ += n;
    return v;
  }
  // Any double, NaN and infinities included, half the time, else one of a
  // few edge values.
  double Double() {
    static constexpr double kEdges[] = {0.0,   -0.0, 1.0,    -1.0,    0.5,
                                        1e-30, 1e30, 3.5e38, -3.5e38, 1e300};
    if (Bool()) return Raw<double>();
    return kEdges[IntInRange(0, std::size(kEdges) - 1)];
  }
  // Up to `max_len` bytes (the length comes first).
  std::string String(size_t max_len) {
    // Two statements: the length bytes are consumed before remaining() is
    // read (argument evaluation order is unspecified, and GCC and clang
    // differ: found by the dispatcher fuzzer's corpus under GCC's ASan).
    const size_t wanted = IntInRange(0, max_len);
    const size_t n = std::min(wanted, remaining());
    std::string s(data_ + pos_, n);
    pos_ += n;
    return s;
  }
  // One of `choices`.
  template <typename T>
  T Pick(std::initializer_list<T> choices) {
    return *(choices.begin() + IntInRange(0, choices.size() - 1));
  }
  std::string_view Rest() {
    std::string_view r(data_ + pos_, remaining());
    pos_ = size_;
    return r;
  }

 private:
  uint8_t Byte() {
    return pos_ < size_ ? static_cast<uint8_t>(data_[pos_++]) : 0;
  }

  const char* data_;
  size_t size_;
  size_t pos_ = 0;
};

}  // namespace downpour

#endif  // DOWNPOUR_TESTING_FUZZ_FUZZ_INPUT_H_
