// NumPy's .npy format (version 1.0), which numpy.load reads: the magic
// "\x93NUMPY", the version, a little-endian u16 header length, a Python
// dict literal {'descr': '<f4', 'fortran_order': False, 'shape': (n, w), }
// padded with spaces and a newline so that the data starts at a multiple of
// 64 bytes, then the raw little-endian data in C order.
//
//   NpyWriter w;
//   DP_RETURN_IF_ERROR(w.Open("w.npy", "<f4", {rows, width}));
//   DP_RETURN_IF_ERROR(w.Write(values.data(), values.size() * 4));  // ...
//   DP_RETURN_IF_ERROR(w.Close());   // kDataLoss if fewer bytes than shape
//
// Thread-compatible.
#ifndef DOWNPOUR_PSCTL_NPY_H_
#define DOWNPOUR_PSCTL_NPY_H_

#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace downpour {

// The header (with its padding) for an array of `descr` ("<f4", "<u8")
// and `shape`.
std::string NpyHeader(const std::string& descr,
                      const std::vector<uint64_t>& shape);

class NpyWriter {
 public:
  NpyWriter() = default;
  ~NpyWriter();  // closes without the check of Close
  NpyWriter(const NpyWriter&) = delete;
  NpyWriter& operator=(const NpyWriter&) = delete;

  // Creates `path` (replacing it) and writes the header. kInvalidArgument
  // for an unknown descr; kUnavailable if the file cannot be written.
  absl::Status Open(const std::string& path, const std::string& descr,
                    const std::vector<uint64_t>& shape);
  // Appends raw data. kOutOfRange past the shape's size.
  absl::Status Write(const void* data, size_t bytes);
  // kDataLoss if the data written does not fill the shape.
  absl::Status Close();

 private:
  std::FILE* file_ = nullptr;
  std::string path_;
  uint64_t expected_ = 0;
  uint64_t written_ = 0;
};

struct NpyArray {
  std::string descr;
  std::vector<uint64_t> shape;
  std::string data;  // raw bytes
};
// Reads a whole .npy file (version 1.0, C order). kNotFound, or kDataLoss
// for a malformed one.
absl::StatusOr<NpyArray> ReadNpy(const std::string& path);

}  // namespace downpour

#endif  // DOWNPOUR_PSCTL_NPY_H_
