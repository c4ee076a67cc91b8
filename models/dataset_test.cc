#include "models/dataset.h"

#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <fstream>
#include <iterator>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "common/test_util.h"

namespace downpour {
namespace {

constexpr char kFashionMnist[] = "/usr/share/datasets/fashion-mnist";

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

void WriteFile(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), bytes.size());
  ASSERT_TRUE(out.good()) << path;
}

void WriteGzip(const std::string& path, const std::string& bytes) {
  gzFile f = gzopen(path.c_str(), "wb");
  ASSERT_NE(f, nullptr) << path;
  ASSERT_EQ(gzwrite(f, bytes.data(), bytes.size()),
            static_cast<int>(bytes.size()));
  ASSERT_EQ(gzclose(f), Z_OK);
}

std::string BigEndian(uint32_t v) {
  return {static_cast<char>(v >> 24), static_cast<char>(v >> 16),
          static_cast<char>(v >> 8), static_cast<char>(v)};
}

std::string IdxImages(uint32_t n, uint32_t rows, uint32_t cols,
                      const std::string& pixels) {
  return BigEndian(0x803) + BigEndian(n) + BigEndian(rows) + BigEndian(cols) +
         pixels;
}

std::string IdxLabels(uint32_t n, const std::string& labels) {
  return BigEndian(0x801) + BigEndian(n) + labels;
}

// A fresh directory under TEST_TMPDIR holding a t10k pair with the given
// (uncompressed) contents.
std::string MakeTestSet(const std::string& name, const std::string& images,
                        const std::string& labels) {
  const std::string dir = TestTmpDir() + "/" + name;
  mkdir(dir.c_str(), 0755);
  WriteGzip(dir + "/t10k-images-idx3-ubyte.gz", images);
  WriteGzip(dir + "/t10k-labels-idx1-ubyte.gz", labels);
  return dir;
}

// Three 2 x 3 images: the smallest valid pair.
const std::string kPixels = std::string("\x00\xff\x01\x02\x80\x7f", 6) +
                            std::string(6, '\x10') + std::string(6, '\xfe');
const std::string kLabels = std::string("\x03\x00\x09", 3);

TEST(LoadFashionMnist, ParsesASmallValidFile) {
  const std::string dir =
      MakeTestSet("valid", IdxImages(3, 2, 3, kPixels), IdxLabels(3, kLabels));
  auto d = LoadFashionMnist(dir, false);
  ASSERT_OK(d);
  EXPECT_EQ(d->num_examples, 3);
  EXPECT_EQ(d->dim, 6);
  EXPECT_EQ(d->num_classes, 10);
  EXPECT_EQ(d->labels, (std::vector<int32_t>{3, 0, 9}));
  ASSERT_EQ(d->features.size(), 18u);
  EXPECT_EQ(d->features[0], 0.0f);
  EXPECT_EQ(d->features[1], 1.0f);
  EXPECT_FLOAT_EQ(d->features[2], 1.0f / 255);
  EXPECT_FLOAT_EQ(d->features[4], 128.0f / 255);
  EXPECT_FLOAT_EQ(d->features[17], 254.0f / 255);
}

TEST(LoadFashionMnist, MissingFilesAreNotFound) {
  EXPECT_THAT(LoadFashionMnist("/nonexistent", true),
              StatusIs(absl::StatusCode::kNotFound));
  // Images present, labels missing.
  const std::string dir = MakeTestSet("no_labels", IdxImages(3, 2, 3, kPixels),
                                      IdxLabels(3, kLabels));
  ASSERT_EQ(unlink((dir + "/t10k-labels-idx1-ubyte.gz").c_str()), 0);
  auto d = LoadFashionMnist(dir, false);
  EXPECT_THAT(d, StatusIs(absl::StatusCode::kNotFound));
  EXPECT_NE(d.status().message().find("t10k-labels-idx1-ubyte.gz"),
            std::string::npos)
      << d.status();
  // The train pair is not there at all.
  EXPECT_THAT(LoadFashionMnist(dir, true),
              StatusIs(absl::StatusCode::kNotFound));
}

TEST(LoadFashionMnist, BadContentsAreDataLoss) {
  struct Case {
    const char* name;
    std::string images, labels;
  };
  const std::vector<Case> cases = {
      {"short_pixels", IdxImages(3, 2, 3, kPixels.substr(0, 17)),
       IdxLabels(3, kLabels)},
      {"extra_pixels", IdxImages(3, 2, 3, kPixels + "x"),
       IdxLabels(3, kLabels)},
      {"short_labels", IdxImages(3, 2, 3, kPixels),
       IdxLabels(3, kLabels.substr(0, 2))},
      {"count_mismatch", IdxImages(3, 2, 3, kPixels),
       IdxLabels(2, kLabels.substr(0, 2))},
      {"images_magic", BigEndian(0x801) + IdxImages(3, 2, 3, kPixels).substr(4),
       IdxLabels(3, kLabels)},
      {"labels_magic", IdxImages(3, 2, 3, kPixels),
       BigEndian(0x803) + IdxLabels(3, kLabels).substr(4)},
      {"header_only", IdxImages(3, 2, 3, "").substr(0, 10),
       IdxLabels(3, kLabels)},
      {"empty_labels", IdxImages(3, 2, 3, kPixels), ""},
      {"zero_dim", IdxImages(3, 0, 3, ""), IdxLabels(3, kLabels)},
      {"label_10", IdxImages(3, 2, 3, kPixels),
       IdxLabels(3, std::string("\x01\x0a\x02", 3))},
      // A header claiming 2^32 - 1 huge images must fail on the size check,
      // not try to allocate them.
      {"huge_header", IdxImages(0xffffffff, 0xffff, 0xffff, kPixels),
       IdxLabels(0xffffffff, kLabels)},
  };
  for (const Case& c : cases) {
    const std::string dir = MakeTestSet(c.name, c.images, c.labels);
    EXPECT_THAT(LoadFashionMnist(dir, false),
                StatusIs(absl::StatusCode::kDataLoss))
        << c.name;
  }
}

// Damage to the compressed bytes of the real test images: cut short, or
// flipped in the middle of the deflate stream.
TEST(LoadFashionMnist, CorruptGzipIsDataLoss) {
  const std::string gz =
      ReadFile(absl::StrCat(kFashionMnist, "/t10k-images-idx3-ubyte.gz"));
  ASSERT_GT(gz.size(), 100000u);
  const std::string labels =
      ReadFile(absl::StrCat(kFashionMnist, "/t10k-labels-idx1-ubyte.gz"));
  const std::string base = TestTmpDir() + "/gz_";
  std::string flipped = gz;
  for (size_t i = gz.size() / 2; i < gz.size() / 2 + 64; ++i)
    flipped[i] ^= 0x5a;
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"truncated_half", gz.substr(0, gz.size() / 2)},
      {"truncated_trailer", gz.substr(0, gz.size() - 4)},  // CRC cut off
      {"flipped", flipped},
      {"not_gzip_garbage", std::string("\x1f\x8b\x08\x00garbage", 11)},
  };
  for (const auto& [name, bytes] : cases) {
    const std::string dir = base + name;
    mkdir(dir.c_str(), 0755);
    WriteFile(dir + "/t10k-images-idx3-ubyte.gz", bytes);
    WriteFile(dir + "/t10k-labels-idx1-ubyte.gz", labels);
    auto d = LoadFashionMnist(dir, false);
    EXPECT_THAT(d, StatusIs(absl::StatusCode::kDataLoss)) << name;
    EXPECT_NE(d.status().message().find("t10k-images-idx3-ubyte.gz"),
              std::string::npos)
        << name << ": " << d.status();
  }
  // The untouched copy loads, so the failures above are the damage's doing.
  const std::string dir = base + "intact";
  mkdir(dir.c_str(), 0755);
  WriteFile(dir + "/t10k-images-idx3-ubyte.gz", gz);
  WriteFile(dir + "/t10k-labels-idx1-ubyte.gz", labels);
  EXPECT_OK(LoadFashionMnist(dir, false));
}

void CheckRealSet(const Dataset& d, int n) {
  EXPECT_EQ(d.num_examples, n);
  EXPECT_EQ(d.dim, 784);
  EXPECT_EQ(d.num_classes, 10);
  ASSERT_EQ(d.features.size(), size_t(n) * 784);
  ASSERT_EQ(d.labels.size(), size_t(n));
  // Fashion-MNIST is balanced: n / 10 examples of each class.
  std::vector<int> per_class(10, 0);
  for (int32_t y : d.labels) {
    ASSERT_GE(y, 0);
    ASSERT_LE(y, 9);
    ++per_class[y];
  }
  for (int c = 0; c < 10; ++c) EXPECT_EQ(per_class[c], n / 10) << "class " << c;
  float lo = 1, hi = 0;
  double sum = 0;
  for (float v : d.features) {
    lo = std::min(lo, v);
    hi = std::max(hi, v);
    sum += v;
  }
  EXPECT_EQ(lo, 0.0f);
  EXPECT_EQ(hi, 1.0f);
  // The mean pixel of Fashion-MNIST is about 0.286.
  EXPECT_NEAR(sum / d.features.size(), 0.286, 0.01);
  // Both files start with an ankle boot (class 9).
  EXPECT_EQ(d.labels[0], 9);
}

TEST(LoadFashionMnist, RealFiles) {
  auto train = LoadFashionMnist(kFashionMnist, true);
  ASSERT_OK(train);
  CheckRealSet(*train, 60000);
  auto test = LoadFashionMnist(kFashionMnist, false);
  ASSERT_OK(test);
  CheckRealSet(*test, 10000);
}

TEST(Shard, StridedAndCoversEverythingOnce) {
  Dataset d;
  d.num_examples = 10;
  d.dim = 2;
  d.num_classes = 10;
  for (int i = 0; i < 10; ++i) {
    d.features.push_back(i);
    d.features.push_back(100 + i);
    d.labels.push_back(i);
  }
  std::vector<int> seen;
  for (int r = 0; r < 3; ++r) {
    const Dataset s = Shard(d, r, 3);
    EXPECT_EQ(s.dim, 2);
    EXPECT_EQ(s.num_classes, 10);
    EXPECT_EQ(s.num_examples, r == 0 ? 4 : 3);
    ASSERT_EQ(s.features.size(), size_t(s.num_examples) * 2);
    for (int i = 0; i < s.num_examples; ++i) {
      EXPECT_EQ(s.labels[i], r + 3 * i);
      EXPECT_EQ(s.features[2 * i], r + 3 * i);
      EXPECT_EQ(s.features[2 * i + 1], 100 + r + 3 * i);
      seen.push_back(s.labels[i]);
    }
  }
  std::sort(seen.begin(), seen.end());
  EXPECT_EQ(seen, (std::vector<int>{0, 1, 2, 3, 4, 5, 6, 7, 8, 9}));
  // More shards than examples: the extra ones are empty.
  EXPECT_EQ(Shard(d, 11, 12).num_examples, 0);
  EXPECT_EQ(Shard(d, 0, 1).features, d.features);
}

TEST(ShardDeathTest, RejectsBadRank) {
  Dataset d;
  EXPECT_DEATH(Shard(d, 3, 3), "rank 3 of 3");
}

}  // namespace
}  // namespace downpour
