#include "models/dataset.h"

#include <zlib.h>

#include <cstring>

#include "absl/strings/str_cat.h"

namespace downpour {
namespace {

// Reads a whole gzip file. kNotFound / kDataLoss.
absl::StatusOr<std::string> ReadGzip(const std::string& path) {
  gzFile f = gzopen(path.c_str(), "rb");
  if (f == nullptr) return absl::NotFoundError(absl::StrCat("cannot open ", path));
  std::string out;
  char buf[1 << 16];
  int n;
  while ((n = gzread(f, buf, sizeof(buf))) > 0) out.append(buf, n);
  int err = 0;
  const char* msg = gzerror(f, &err);
  const bool bad = n < 0 || (err != Z_OK && err != Z_STREAM_END);
  std::string why = bad ? msg : "";
  gzclose(f);
  if (bad) return absl::DataLossError(absl::StrCat(path, ": ", why));
  return out;
}

uint32_t BigEndian32(const std::string& s, size_t off) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data() + off);
  return (uint32_t{p[0]} << 24) | (uint32_t{p[1]} << 16) | (uint32_t{p[2]} << 8) | p[3];
}

}  // namespace

absl::StatusOr<Dataset> LoadFashionMnist(const std::string& dir, bool train) {
  const std::string prefix = absl::StrCat(dir, "/", train ? "train" : "t10k");
  const std::string ipath = prefix + "-images-idx3-ubyte.gz";
  const std::string lpath = prefix + "-labels-idx1-ubyte.gz";
  auto images = ReadGzip(ipath);
  if (!images.ok()) return images.status();
  auto labels = ReadGzip(lpath);
  if (!labels.ok()) return labels.status();
  if (images->size() < 16 || BigEndian32(*images, 0) != 0x803) {
    return absl::DataLossError(absl::StrCat(ipath, ": not an IDX3 image file"));
  }
  if (labels->size() < 8 || BigEndian32(*labels, 0) != 0x801) {
    return absl::DataLossError(absl::StrCat(lpath, ": not an IDX1 label file"));
  }
  const uint32_t n = BigEndian32(*images, 4);
  const uint32_t rows = BigEndian32(*images, 8), cols = BigEndian32(*images, 12);
  if (BigEndian32(*labels, 4) != n) {
    return absl::DataLossError(absl::StrCat(ipath, " and ", lpath, " disagree on the count"));
  }
  const uint64_t dim = uint64_t{rows} * cols;
  if (dim == 0 || dim > (1u << 20) || images->size() != 16 + n * dim ||
      labels->size() != 8 + uint64_t{n}) {
    return absl::DataLossError(absl::StrCat(ipath, ": truncated or wrong size"));
  }
  Dataset d;
  d.num_examples = static_cast<int>(n);
  d.dim = static_cast<int>(dim);
  d.num_classes = 10;
  d.features.resize(n * dim);
  const auto* px = reinterpret_cast<const unsigned char*>(images->data() + 16);
  for (size_t i = 0; i < d.features.size(); ++i) d.features[i] = px[i] / 255.0f;
  d.labels.resize(n);
  const auto* lb = reinterpret_cast<const unsigned char*>(labels->data() + 8);
  for (uint32_t i = 0; i < n; ++i) {
    if (lb[i] >= 10) {
      return absl::DataLossError(absl::StrCat(lpath, ": label ", int{lb[i]}, " at ", i));
    }
    d.labels[i] = lb[i];
  }
  return d;
}

Dataset Shard(const Dataset& data, int rank, int num_shards) {
  Dataset s;
  s.dim = data.dim;
  s.num_classes = data.num_classes;
  for (int i = rank; i < data.num_examples; i += num_shards) {
    s.features.insert(s.features.end(), data.features.begin() + size_t(i) * data.dim,
                      data.features.begin() + size_t(i + 1) * data.dim);
    s.labels.push_back(data.labels[i]);
  }
  s.num_examples = static_cast<int>(s.labels.size());
  return s;
}

}  // namespace downpour
