#include "models/dataset.h"

#include <zlib.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/logging.h"

namespace downpour {
namespace {

// Reads a whole gzip file into memory.
absl::StatusOr<std::string> ReadGzip(const std::string& path) {
  errno = 0;
  gzFile f = gzopen(path.c_str(), "rb");
  if (f == nullptr) {
    return absl::NotFoundError(
        absl::StrCat("cannot open ", path, ": ", std::strerror(errno)));
  }
  // A bigger buffer than zlib's 8 KiB default roughly halves the time spent
  // on the 26 MB training images.
  gzbuffer(f, 1 << 18);
  std::string out;
  char buf[1 << 16];
  int n;
  while ((n = gzread(f, buf, sizeof(buf))) > 0) out.append(buf, n);
  // gzread reports a truncated stream (Z_BUF_ERROR), a bad CRC or corrupt
  // deflate data (Z_DATA_ERROR) only through gzerror, sometimes after
  // returning the data it could decode.
  int err = Z_OK;
  const char* msg = gzerror(f, &err);
  const bool bad = n < 0 || (err != Z_OK && err != Z_STREAM_END);
  const std::string why = bad && msg != nullptr ? msg : "";
  gzclose(f);
  if (bad) return absl::DataLossError(absl::StrCat(path, ": ", why));
  return out;
}

uint32_t BigEndian32(absl::string_view s, size_t off) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data() + off);
  return (uint32_t{p[0]} << 24) | (uint32_t{p[1]} << 16) |
         (uint32_t{p[2]} << 8) | p[3];
}

// IDX magic numbers: two zero bytes, the element type (0x08 = unsigned
// byte) and the number of dimensions.
constexpr uint32_t kIdxImages = 0x00000803;
constexpr uint32_t kIdxLabels = 0x00000801;
constexpr int kNumClasses = 10;

}  // namespace

absl::StatusOr<Dataset> LoadFashionMnist(const std::string& dir, bool train) {
  const std::string prefix = absl::StrCat(dir, "/", train ? "train" : "t10k");
  const std::string ipath = prefix + "-images-idx3-ubyte.gz";
  const std::string lpath = prefix + "-labels-idx1-ubyte.gz";
  absl::StatusOr<std::string> images = ReadGzip(ipath);
  if (!images.ok()) return images.status();
  absl::StatusOr<std::string> labels = ReadGzip(lpath);
  if (!labels.ok()) return labels.status();
  return ParseIdx(*images, *labels, ipath, lpath);
}

absl::StatusOr<Dataset> ParseIdx(absl::string_view images,
                                 absl::string_view labels,
                                 absl::string_view ipath,
                                 absl::string_view lpath) {
  if (images.size() < 16 || BigEndian32(images, 0) != kIdxImages) {
    return absl::DataLossError(absl::StrCat(ipath, ": not an IDX3 image file"));
  }
  if (labels.size() < 8 || BigEndian32(labels, 0) != kIdxLabels) {
    return absl::DataLossError(absl::StrCat(lpath, ": not an IDX1 label file"));
  }
  const uint64_t n = BigEndian32(images, 4);
  const uint64_t rows = BigEndian32(images, 8);
  const uint64_t cols = BigEndian32(images, 12);
  const uint64_t dim = rows * cols;  // < 2^64: both factors are < 2^32
  if (BigEndian32(labels, 4) != n) {
    return absl::DataLossError(absl::StrCat(ipath, " has ", n, " images but ",
                                            lpath, " has ",
                                            BigEndian32(labels, 4), " labels"));
  }
  // The size check comes before any allocation, so a corrupt header cannot
  // make us allocate more than the file holds. The dim bound keeps n * dim
  // and the int fields from overflowing.
  if (dim == 0 || dim > (1u << 24) || images.size() != 16 + n * dim) {
    return absl::DataLossError(
        absl::StrCat(ipath, ": header says ", n, " x ", rows, " x ", cols,
                     " bytes of pixels, file has ", images.size() - 16));
  }
  if (labels.size() != 8 + n) {
    return absl::DataLossError(absl::StrCat(
        lpath, ": header says ", n, " labels, file has ", labels.size() - 8));
  }
  if (n > static_cast<uint64_t>(INT32_MAX)) {
    return absl::DataLossError(absl::StrCat(ipath, ": too many images"));
  }
  Dataset d;
  d.num_examples = static_cast<int>(n);
  d.dim = static_cast<int>(dim);
  d.num_classes = kNumClasses;
  d.labels.resize(n);
  const auto* lb = reinterpret_cast<const unsigned char*>(labels.data() + 8);
  for (uint64_t i = 0; i < n; ++i) {
    if (lb[i] >= kNumClasses) {
      return absl::DataLossError(
          absl::StrCat(lpath, ": label ", int{lb[i]}, " at index ", i));
    }
    d.labels[i] = lb[i];
  }
  d.features.resize(n * dim);
  const auto* px = reinterpret_cast<const unsigned char*>(images.data() + 16);
  for (size_t i = 0; i < d.features.size(); ++i) {
    d.features[i] = px[i] / 255.0f;  // exactly 1.0f for 255
  }
  return d;
}

Dataset Shard(const Dataset& data, int rank, int num_shards) {
  DP_CHECK(num_shards >= 1 && rank >= 0 && rank < num_shards)
      << "rank " << rank << " of " << num_shards;
  Dataset s;
  s.dim = data.dim;
  s.num_classes = data.num_classes;
  const size_t count =
      data.num_examples > rank
          ? static_cast<size_t>((data.num_examples - rank - 1) / num_shards + 1)
          : 0;
  s.features.reserve(count * data.dim);
  s.labels.reserve(count);
  for (int i = rank; i < data.num_examples; i += num_shards) {
    const auto row = data.features.begin() + static_cast<size_t>(i) * data.dim;
    s.features.insert(s.features.end(), row, row + data.dim);
    s.labels.push_back(data.labels[i]);
  }
  s.num_examples = static_cast<int>(s.labels.size());
  return s;
}

}  // namespace downpour
