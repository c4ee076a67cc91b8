#include "handlers/vector_kernel.h"

#include <random>
#include <vector>

#include "common/test_util.h"
#include "gtest/gtest.h"

namespace downpour {
namespace {

using proto::VectorCommand;

// Three vectors of n floats drawn from a seeded normal.
struct Vectors {
  explicit Vectors(size_t n, uint32_t seed = 7)
      : data(3, std::vector<float>(n)) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> dist;
    for (auto& v : data) {
      for (float& x : v) x = dist(rng);
    }
  }
  std::vector<float*> ptrs() {
    return {data[0].data(), data[1].data(), data[2].data()};
  }
  std::vector<std::vector<float>> data;
};

VectorCommand Update(VectorCommand::Update u, uint32_t dst, uint32_t a,
                     uint32_t b, double alpha, double beta) {
  VectorCommand c;
  c.set_update(u);
  c.set_dst(dst);
  c.set_a(a);
  c.set_b(b);
  c.set_alpha(alpha);
  c.set_beta(beta);
  return c;
}

TEST(VectorKernelTest, UpdatesMatchReference) {
  const size_t n = 5000;  // several blocks and a partial one
  struct Case {
    VectorCommand::Update u;
    std::function<float(float, float, float)> ref;  // (dst, a, b) -> new dst
  };
  const double alpha = 0.37, beta = -1.25;
  const std::vector<Case> cases = {
      {VectorCommand::ZERO, [](float, float, float) { return 0.0f; }},
      {VectorCommand::COPY, [](float, float a, float) { return a; }},
      {VectorCommand::SCALE,
       [&](float d, float, float) { return static_cast<float>(alpha * d); }},
      {VectorCommand::AXPY,
       [&](float d, float a, float) {
         return static_cast<float>(d + alpha * a);
       }},
      {VectorCommand::LINCOMB,
       [&](float, float a, float b) {
         return static_cast<float>(alpha * a + beta * b);
       }},
  };
  for (const Case& c : cases) {
    Vectors v(n);
    const Vectors before = v;
    ASSERT_OK_AND_ASSIGN(
        VectorKernel k,
        VectorKernel::Create(Update(c.u, 0, 1, 2, alpha, beta), 3));
    std::vector<float*> p = v.ptrs();
    k.Apply(p.data(), n, nullptr);
    for (size_t i = 0; i < n; ++i) {
      ASSERT_EQ(v.data[0][i],
                c.ref(before.data[0][i], before.data[1][i], before.data[2][i]))
          << VectorCommand::Update_Name(c.u) << " at " << i;
    }
    EXPECT_EQ(v.data[1], before.data[1]);
    EXPECT_EQ(v.data[2], before.data[2]);
  }
}

TEST(VectorKernelTest, FusedDotsSeeTheUpdateAndSplitRunsAgree) {
  const size_t n = 3001;
  Vectors v(n), w(n);
  VectorCommand c = Update(VectorCommand::AXPY, 0, 1, 0, -0.5, 0);
  c.add_dot_x(0);
  c.add_dot_y(2);
  c.add_dot_x(0);
  c.add_dot_y(0);
  ASSERT_OK_AND_ASSIGN(VectorKernel k, VectorKernel::Create(c, 3));
  ASSERT_EQ(k.num_dots(), 2);
  // One run over everything.
  double whole[2] = {0, 0};
  std::vector<float*> p = v.ptrs();
  k.Apply(p.data(), n, whole);
  // Reference: update first, then dots in double.
  double ref0 = 0, ref1 = 0;
  for (size_t i = 0; i < n; ++i) {
    const float d = static_cast<float>(w.data[0][i] - 0.5 * w.data[1][i]);
    ref0 += static_cast<double>(d) * w.data[2][i];
    ref1 += static_cast<double>(d) * d;
  }
  EXPECT_DOUBLE_EQ(whole[0], ref0);
  EXPECT_DOUBLE_EQ(whole[1], ref1);
  // Two runs (as two owned ranges would be) add up to nearly the same.
  double split[2] = {0, 0};
  std::vector<float*> q = w.ptrs();
  k.Apply(q.data(), 1000, split);
  for (float*& ptr : q) ptr += 1000;
  k.Apply(q.data(), n - 1000, split);
  EXPECT_NEAR(split[0], ref0, 1e-9 * std::abs(ref0) + 1e-12);
  EXPECT_NEAR(split[1], ref1, 1e-9 * ref1);
}

TEST(VectorKernelTest, RejectsBadCommands) {
  EXPECT_THAT(
      VectorKernel::Create(Update(VectorCommand::AXPY, 0, 3, 0, 1, 0), 3)
          .status(),
      StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(
      VectorKernel::Create(Update(VectorCommand::SCALE, 5, 0, 0, 1, 0), 3)
          .status(),
      StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(VectorKernel::Create(
                  Update(VectorCommand::SCALE, 0, 0, 0, std::nan(""), 0), 3)
                  .status(),
              StatusIs(absl::StatusCode::kInvalidArgument));
  VectorCommand unequal;
  unequal.add_dot_x(0);
  EXPECT_THAT(VectorKernel::Create(unequal, 3).status(),
              StatusIs(absl::StatusCode::kInvalidArgument));
  VectorCommand many;
  for (int j = 0; j <= kMaxVectorDots; ++j) {
    many.add_dot_x(0);
    many.add_dot_y(1);
  }
  EXPECT_THAT(VectorKernel::Create(many, 3).status(),
              StatusIs(absl::StatusCode::kInvalidArgument));
  VectorCommand round = Update(VectorCommand::COPY, 0, 1, 0, 0, 0);
  round.set_open_round(3);
  EXPECT_THAT(VectorKernel::Create(round, 3).status(),
              StatusIs(absl::StatusCode::kInvalidArgument));
  VectorCommand unknown;
  unknown.set_update(static_cast<VectorCommand::Update>(42));
  EXPECT_THAT(VectorKernel::Create(unknown, 3).status(),
              StatusIs(absl::StatusCode::kInvalidArgument));
}

}  // namespace
}  // namespace downpour
