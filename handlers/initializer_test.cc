#include "handlers/initializer.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "common/test_util.h"

namespace downpour {
namespace {

proto::InitializerSpec Uniform(float low, float high, uint64_t seed = 1) {
  proto::InitializerSpec spec;
  spec.set_kind(proto::InitializerSpec::UNIFORM);
  spec.set_low(low);
  spec.set_high(high);
  spec.set_seed(seed);
  return spec;
}

proto::InitializerSpec Normal(float mean, float stddev, uint64_t seed = 1) {
  proto::InitializerSpec spec;
  spec.set_kind(proto::InitializerSpec::NORMAL);
  spec.set_mean(mean);
  spec.set_stddev(stddev);
  spec.set_seed(seed);
  return spec;
}

bool SameBits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() &&
         std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

std::vector<proto::InitializerSpec> RandomSpecs() {
  return {Uniform(-0.5f, 0.5f, 3), Normal(0.0f, 1.0f, 3)};
}

TEST(InitializerTest, FillEqualsFillRow) {
  for (const auto& spec : RandomSpecs()) {
    auto init = Initializer::Create(spec);
    ASSERT_OK(init);
    constexpr size_t kRows = 50, kWidth = 7;
    constexpr Key kFirst = 1000;
    std::vector<float> batch(kRows * kWidth), rows(kRows * kWidth);
    init->Fill(kFirst, kRows, kWidth, batch.data());
    for (size_t r = 0; r < kRows; ++r) {
      init->FillRow(kFirst + r, kWidth, rows.data() + r * kWidth);
    }
    EXPECT_TRUE(SameBits(batch, rows)) << spec.ShortDebugString();
  }
}

// Rows touched in another order, in other batches, or by another instance
// built from the same spec (another server) get the same values.
TEST(InitializerTest, IndependentOfOrderBatchingAndInstance) {
  for (const auto& spec : RandomSpecs()) {
    auto a = Initializer::Create(spec);
    auto b = Initializer::Create(spec);
    ASSERT_OK(a);
    ASSERT_OK(b);
    constexpr size_t kRows = 40, kWidth = 5;
    std::vector<float> whole(kRows * kWidth), pieces(kRows * kWidth);
    a->Fill(0, kRows, kWidth, whole.data());
    // Backwards, in uneven pieces.
    b->Fill(33, 7, kWidth, pieces.data() + 33 * kWidth);
    b->Fill(10, 23, kWidth, pieces.data() + 10 * kWidth);
    for (size_t r = 10; r-- > 0;) {
      b->FillRow(r, kWidth, pieces.data() + r * kWidth);
    }
    EXPECT_TRUE(SameBits(whole, pieces)) << spec.ShortDebugString();
  }
}

// Column c of a row does not depend on the width.
TEST(InitializerTest, IndependentOfWidth) {
  for (const auto& spec : RandomSpecs()) {
    auto init = Initializer::Create(spec);
    ASSERT_OK(init);
    std::vector<float> wide(16), narrow(5);
    init->FillRow(77, 16, wide.data());
    init->FillRow(77, 5, narrow.data());
    EXPECT_TRUE(
        SameBits(narrow, std::vector<float>(wide.begin(), wide.begin() + 5)))
        << spec.ShortDebugString();
  }
}

TEST(InitializerTest, SeedAndKeyChangeValues) {
  for (const auto& spec : RandomSpecs()) {
    proto::InitializerSpec other_seed = spec;
    other_seed.set_seed(spec.seed() + 1);
    auto a = Initializer::Create(spec);
    auto b = Initializer::Create(other_seed);
    ASSERT_OK(a);
    ASSERT_OK(b);
    std::vector<float> x(8), y(8), z(8);
    a->FillRow(5, 8, x.data());
    b->FillRow(5, 8, y.data());
    a->FillRow(6, 8, z.data());
    EXPECT_FALSE(SameBits(x, y));
    EXPECT_FALSE(SameBits(x, z));
  }
}

TEST(InitializerTest, ZerosAndConstant) {
  proto::InitializerSpec zeros;  // the default kind
  auto z = Initializer::Create(zeros);
  ASSERT_OK(z);
  std::vector<float> out(12, -1.0f);
  z->Fill(3, 3, 4, out.data());
  EXPECT_EQ(out, std::vector<float>(12, 0.0f));
  std::fill(out.begin(), out.end(), -1.0f);
  z->FillRow(1, 2, out.data());
  EXPECT_EQ(out[0], 0.0f);
  EXPECT_EQ(out[1], 0.0f);
  EXPECT_EQ(out[2], -1.0f);  // only `width` floats are written

  proto::InitializerSpec constant;
  constant.set_kind(proto::InitializerSpec::CONSTANT);
  constant.set_value(0.25f);
  auto c = Initializer::Create(constant);
  ASSERT_OK(c);
  c->Fill(3, 3, 4, out.data());
  EXPECT_EQ(out, std::vector<float>(12, 0.25f));
  std::vector<float> row(5, 0.0f);
  c->FillRow(99, 5, row.data());
  EXPECT_EQ(row, std::vector<float>(5, 0.25f));
}

struct Moments {
  double mean, stddev, min, max;
};

Moments Measure(const std::vector<float>& v) {
  double sum = 0, sum_sq = 0;
  double lo = std::numeric_limits<double>::infinity(), hi = -lo;
  for (float x : v) {
    sum += x;
    sum_sq += static_cast<double>(x) * x;
    lo = std::min<double>(lo, x);
    hi = std::max<double>(hi, x);
  }
  const double mean = sum / v.size();
  return {mean, std::sqrt(sum_sq / v.size() - mean * mean), lo, hi};
}

// ~100k samples: 20,000 rows of width 5 (rows vary the key, columns the
// column hash). Bounds are loose (many standard errors) so that the test
// checks the transform, not luck.
TEST(InitializerTest, UniformMoments) {
  auto init = Initializer::Create(Uniform(-2.0f, 3.0f, 42));
  ASSERT_OK(init);
  std::vector<float> v(20000 * 5);
  init->Fill(123456789, 20000, 5, v.data());
  const Moments m = Measure(v);
  EXPECT_NEAR(m.mean, 0.5, 0.03);
  EXPECT_NEAR(m.stddev, 5.0 / std::sqrt(12.0), 0.02);
  EXPECT_GE(m.min, -2.0);
  EXPECT_LT(m.max, 3.0);
  EXPECT_LT(m.min, -1.99);
  EXPECT_GT(m.max, 2.99);
}

TEST(InitializerTest, NormalMoments) {
  auto init = Initializer::Create(Normal(1.5f, 2.0f, 42));
  ASSERT_OK(init);
  constexpr size_t kRows = 20000, kWidth = 5;
  std::vector<float> v(kRows * kWidth);
  init->Fill(0, kRows, kWidth, v.data());
  const Moments m = Measure(v);
  EXPECT_NEAR(m.mean, 1.5, 0.03);
  EXPECT_NEAR(m.stddev, 2.0, 0.03);
  size_t within_one = 0;
  for (float x : v) within_one += std::abs(x - 1.5) < 2.0;
  EXPECT_NEAR(static_cast<double>(within_one) / v.size(), 0.6827, 0.01);
  // Columns 0 and 1 share a Box-Muller pair (cos and sin); they must still
  // be uncorrelated, and so must neighbouring rows.
  double col01 = 0, rows01 = 0;
  for (size_t r = 0; r + 1 < kRows; ++r) {
    col01 += (v[r * kWidth] - 1.5) * (v[r * kWidth + 1] - 1.5);
    rows01 += (v[r * kWidth] - 1.5) * (v[(r + 1) * kWidth] - 1.5);
  }
  EXPECT_NEAR(col01 / (kRows - 1) / 4.0, 0.0, 0.03);
  EXPECT_NEAR(rows01 / (kRows - 1) / 4.0, 0.0, 0.03);
}

TEST(InitializerTest, DegenerateRanges) {
  auto uniform = Initializer::Create(Uniform(0.5f, 0.5f));
  ASSERT_OK(uniform);
  std::vector<float> v(6);
  uniform->FillRow(1, 6, v.data());
  EXPECT_EQ(v, std::vector<float>(6, 0.5f));

  auto normal = Initializer::Create(Normal(-3.0f, 0.0f));
  ASSERT_OK(normal);
  normal->FillRow(1, 6, v.data());
  EXPECT_EQ(v, std::vector<float>(6, -3.0f));
}

// The interval is half-open even where float rounding would reach `high`:
// a tiny interval has few representable values, all of them below high.
TEST(InitializerTest, UniformExcludesHigh) {
  const float low = 1.0f,
              high = std::nextafter(std::nextafter(1.0f, 2.0f), 2.0f);
  auto init = Initializer::Create(Uniform(low, high));
  ASSERT_OK(init);
  std::vector<float> v(10000);
  init->Fill(0, 1000, 10, v.data());
  for (float x : v) {
    ASSERT_GE(x, low);
    ASSERT_LT(x, high);
  }
}

TEST(InitializerTest, InvalidSpecs) {
  const float kNan = std::numeric_limits<float>::quiet_NaN();
  const float kInf = std::numeric_limits<float>::infinity();
  const auto invalid = absl::StatusCode::kInvalidArgument;
  EXPECT_THAT(Initializer::Create(Uniform(1.0f, 0.0f)), StatusIs(invalid));
  EXPECT_THAT(Initializer::Create(Uniform(kNan, 1.0f)), StatusIs(invalid));
  EXPECT_THAT(Initializer::Create(Uniform(0.0f, kInf)), StatusIs(invalid));
  EXPECT_THAT(Initializer::Create(Normal(0.0f, -1.0f)), StatusIs(invalid));
  EXPECT_THAT(Initializer::Create(Normal(kInf, 1.0f)), StatusIs(invalid));
  EXPECT_THAT(Initializer::Create(Normal(0.0f, kNan)), StatusIs(invalid));
  EXPECT_THAT(Initializer::Create(Normal(0.0f, 1e38f)), StatusIs(invalid));
  proto::InitializerSpec constant;
  constant.set_kind(proto::InitializerSpec::CONSTANT);
  constant.set_value(kNan);
  EXPECT_THAT(Initializer::Create(constant), StatusIs(invalid));
  proto::InitializerSpec unknown;
  unknown.set_kind(static_cast<proto::InitializerSpec::Kind>(17));
  EXPECT_THAT(Initializer::Create(unknown), StatusIs(invalid));
}

}  // namespace
}  // namespace downpour
