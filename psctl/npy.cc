#include "psctl/npy.h"

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace downpour {
namespace {

size_t ItemSize(const std::string& descr) {
  if (descr == "<f4" || descr == "<u4" || descr == "<i4") return 4;
  if (descr == "<f8" || descr == "<u8" || descr == "<i8") return 8;
  return 0;
}

}  // namespace

std::string NpyHeader(const std::string& descr,
                      const std::vector<uint64_t>& shape) {
  // Python's tuples: (n,) and (n, w).
  std::string dims = absl::StrJoin(shape, ", ");
  if (shape.size() == 1) dims.push_back(',');
  std::string dict =
      absl::StrCat("{'descr': '", descr,
                   "', 'fortran_order': False, 'shape': (", dims, "), }");
  // magic (6) + version (2) + length (2) + dict + padding + '\n' = k * 64
  const size_t unpadded = 10 + dict.size() + 1;
  dict.append((64 - unpadded % 64) % 64, ' ');
  dict.push_back('\n');
  std::string out("\x93NUMPY\x01\x00", 8);
  out.push_back(static_cast<char>(dict.size() & 0xff));
  out.push_back(static_cast<char>(dict.size() >> 8));
  return out + dict;
}

NpyWriter::~NpyWriter() {
  if (file_ != nullptr) std::fclose(file_);
}

absl::Status NpyWriter::Open(const std::string& path, const std::string& descr,
                             const std::vector<uint64_t>& shape) {
  const size_t item = ItemSize(descr);
  if (item == 0) {
    return absl::InvalidArgumentError(absl::StrCat("npy: dtype ", descr));
  }
  path_ = path;
  file_ = std::fopen(path.c_str(), "wb");
  if (file_ == nullptr) {
    return absl::UnavailableError(
        absl::StrCat("cannot create ", path, ": ", std::strerror(errno)));
  }
  expected_ = item;
  for (uint64_t d : shape) expected_ *= d;
  written_ = 0;
  const std::string header = NpyHeader(descr, shape);
  if (std::fwrite(header.data(), 1, header.size(), file_) != header.size()) {
    return absl::UnavailableError(absl::StrCat("cannot write ", path));
  }
  return absl::OkStatus();
}

absl::Status NpyWriter::Write(const void* data, size_t bytes) {
  if (written_ + bytes > expected_) {
    return absl::OutOfRangeError(absl::StrCat(
        path_, ": ", written_ + bytes, " bytes, the shape holds ", expected_));
  }
  if (bytes > 0 && std::fwrite(data, 1, bytes, file_) != bytes) {
    return absl::UnavailableError(
        absl::StrCat("cannot write ", path_, ": ", std::strerror(errno)));
  }
  written_ += bytes;
  return absl::OkStatus();
}

absl::Status NpyWriter::Close() {
  if (file_ == nullptr) return absl::FailedPreconditionError("not open");
  const bool flushed = std::fclose(file_) == 0;
  file_ = nullptr;
  if (!flushed)
    return absl::UnavailableError(absl::StrCat("cannot write ", path_));
  if (written_ != expected_) {
    return absl::DataLossError(
        absl::StrCat(path_, ": ", written_, " bytes written of ", expected_));
  }
  return absl::OkStatus();
}

absl::StatusOr<NpyArray> ReadNpy(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot open ", path));
  std::stringstream ss;
  ss << in.rdbuf();
  const std::string all = ss.str();
  auto bad = [&](absl::string_view why) {
    return absl::DataLossError(absl::StrCat(path, ": not a .npy file: ", why));
  };
  if (all.size() < 10 || all.compare(0, 6, "\x93NUMPY") != 0 || all[6] != 1 ||
      all[7] != 0) {
    return bad("magic or version");
  }
  const size_t len = static_cast<uint8_t>(all[8]) |
                     static_cast<size_t>(static_cast<uint8_t>(all[9])) << 8;
  if (all.size() < 10 + len || (10 + len) % 64 != 0) return bad("header");
  absl::string_view dict(all.data() + 10, len);
  NpyArray out;
  auto field = [&](absl::string_view key) -> absl::string_view {
    const size_t at = dict.find(key);
    if (at == absl::string_view::npos) return {};
    return dict.substr(at + key.size());
  };
  absl::string_view d = field("'descr': '");
  out.descr = std::string(d.substr(0, d.find('\'')));
  if (!absl::StartsWith(field("'fortran_order': "), "False")) {
    return bad("Fortran order");
  }
  absl::string_view s = field("'shape': (");
  s = s.substr(0, s.find(')'));
  for (absl::string_view dim : absl::StrSplit(s, ',', absl::SkipWhitespace())) {
    uint64_t v;
    if (!absl::SimpleAtoi(absl::StripAsciiWhitespace(dim), &v)) {
      return bad("shape");
    }
    out.shape.push_back(v);
  }
  size_t bytes = ItemSize(out.descr);
  if (bytes == 0) return bad(absl::StrCat("dtype ", out.descr));
  for (uint64_t v : out.shape) bytes *= v;
  out.data = all.substr(10 + len);
  if (out.data.size() != bytes) return bad("data size");
  return out;
}

}  // namespace downpour
