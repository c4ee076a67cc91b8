#include "psctl/npy.h"

#include <cstring>
#include <vector>

#include "common/test_util.h"

namespace downpour {
namespace {

TEST(NpyTest, HeaderIsNumpysFormat) {
  const std::string h = NpyHeader("<f4", {3, 2});
  // As numpy.save writes it: 128 bytes in all for this shape.
  ASSERT_EQ(h.size(), 128u);
  EXPECT_EQ(h.substr(0, 8), std::string("\x93NUMPY\x01\x00", 8));
  EXPECT_EQ(static_cast<uint8_t>(h[8]), 118);  // 128 - 10
  EXPECT_EQ(h[9], 0);
  const std::string dict =
      "{'descr': '<f4', 'fortran_order': False, 'shape': (3, 2), }";
  EXPECT_EQ(h.substr(10, dict.size()), dict);
  EXPECT_EQ(h.find_first_not_of(' ', 10 + dict.size()), h.size() - 1);
  EXPECT_EQ(h.back(), '\n');
  // A one-dimensional shape keeps Python's trailing comma.
  EXPECT_NE(NpyHeader("<u8", {5}).find("'shape': (5,), }"), std::string::npos);
}

TEST(NpyTest, WrittenArraysReadBackBitForBit) {
  const std::string path = TestTmpDir() + "/a.npy";
  std::vector<float> v = {1.5f, -0.0f, 3e-38f, 7.25f, 1e30f, -2.0f};
  NpyWriter w;
  ASSERT_OK(w.Open(path, "<f4", {3, 2}));
  ASSERT_OK(w.Write(v.data(), 4 * sizeof(float)));
  ASSERT_OK(w.Write(v.data() + 4, 2 * sizeof(float)));
  EXPECT_THAT(w.Write(v.data(), 4), StatusIs(absl::StatusCode::kOutOfRange));
  ASSERT_OK(w.Close());
  ASSERT_OK_AND_ASSIGN(NpyArray a, ReadNpy(path));
  EXPECT_EQ(a.descr, "<f4");
  EXPECT_EQ(a.shape, (std::vector<uint64_t>{3, 2}));
  ASSERT_EQ(a.data.size(), v.size() * sizeof(float));
  EXPECT_EQ(std::memcmp(a.data.data(), v.data(), a.data.size()), 0);
}

TEST(NpyTest, ShortDataIsRefused) {
  const std::string path = TestTmpDir() + "/short.npy";
  NpyWriter w;
  ASSERT_OK(w.Open(path, "<u8", {4}));
  const uint64_t one = 1;
  ASSERT_OK(w.Write(&one, sizeof(one)));
  EXPECT_THAT(w.Close(), StatusIs(absl::StatusCode::kDataLoss));
  EXPECT_THAT(ReadNpy(path), StatusIs(absl::StatusCode::kDataLoss));
  EXPECT_THAT(ReadNpy(TestTmpDir() + "/none.npy"),
              StatusIs(absl::StatusCode::kNotFound));
}

}  // namespace
}  // namespace downpour
