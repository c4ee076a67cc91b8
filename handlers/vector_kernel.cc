#include "handlers/vector_kernel.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"

namespace downpour {

absl::StatusOr<VectorKernel> VectorKernel::Create(
    const proto::VectorCommand& cmd, size_t num_vectors) {
  auto check = [&](const char* role, uint32_t v) -> absl::Status {
    if (v >= num_vectors) {
      return absl::InvalidArgumentError(
          absl::StrCat("vector command: ", role, " is vector ", v,
                       " but the table has ", num_vectors, " vectors"));
    }
    return absl::OkStatus();
  };
  using U = proto::VectorCommand;
  absl::Status s;
  switch (cmd.update()) {
    case U::NONE:
      break;
    case U::ZERO:
    case U::SCALE:
      s = check("dst", cmd.dst());
      break;
    case U::COPY:
    case U::AXPY:
      s = check("dst", cmd.dst());
      if (s.ok()) s = check("a", cmd.a());
      break;
    case U::LINCOMB:
      s = check("dst", cmd.dst());
      if (s.ok()) s = check("a", cmd.a());
      if (s.ok()) s = check("b", cmd.b());
      break;
    default:
      return absl::InvalidArgumentError(absl::StrCat(
          "vector command: unknown update ", static_cast<int>(cmd.update())));
  }
  if (!s.ok()) return s;
  if (!std::isfinite(cmd.alpha()) || !std::isfinite(cmd.beta())) {
    return absl::InvalidArgumentError(
        absl::StrCat("vector command: alpha ", cmd.alpha(), " and beta ",
                     cmd.beta(), " must be finite"));
  }
  if (cmd.dot_x_size() != cmd.dot_y_size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("vector command: ", cmd.dot_x_size(), " left and ",
                     cmd.dot_y_size(), " right operands of dot products"));
  }
  if (cmd.dot_x_size() > kMaxVectorDots) {
    return absl::InvalidArgumentError(
        absl::StrCat("vector command: ", cmd.dot_x_size(),
                     " dot products, at most ", kMaxVectorDots));
  }
  for (int j = 0; j < cmd.dot_x_size(); ++j) {
    if (s = check("a dot operand", cmd.dot_x(j)); !s.ok()) return s;
    if (s = check("a dot operand", cmd.dot_y(j)); !s.ok()) return s;
  }
  if (cmd.open_round() != 0 && cmd.update() != U::ZERO) {
    return absl::InvalidArgumentError(
        "vector command: open_round needs the ZERO update");
  }
  if (cmd.open_round() < 0) {
    return absl::InvalidArgumentError("vector command: negative open_round");
  }
  return VectorKernel(cmd);
}

bool VectorKernel::Uses(size_t v) const {
  using U = proto::VectorCommand;
  const U::Update u = cmd_.update();
  if (u != U::NONE && v == cmd_.dst()) return true;
  if ((u == U::COPY || u == U::AXPY || u == U::LINCOMB) && v == cmd_.a()) {
    return true;
  }
  if (u == U::LINCOMB && v == cmd_.b()) return true;
  for (int j = 0; j < cmd_.dot_x_size(); ++j) {
    if (cmd_.dot_x(j) == v || cmd_.dot_y(j) == v) return true;
  }
  return false;
}

void VectorKernel::Apply(float* const* vectors, size_t n,
                         double* partials) const {
  using U = proto::VectorCommand;
  // Blocks small enough to stay in L1 between the update and the dots.
  constexpr size_t kBlock = 1024;
  const double alpha = cmd_.alpha(), beta = cmd_.beta();
  for (size_t start = 0; start < n; start += kBlock) {
    const size_t len = std::min(kBlock, n - start);
    if (cmd_.update() != U::NONE) {
      // Only the operands the update uses are valid pointers.
      float* dst = vectors[cmd_.dst()] + start;
      auto a_at = [&] { return vectors[cmd_.a()] + start; };
      auto b_at = [&] { return vectors[cmd_.b()] + start; };
      switch (cmd_.update()) {
        case U::ZERO:
          std::fill(dst, dst + len, 0.0f);
          break;
        case U::COPY: {
          const float* a = a_at();
          if (dst != a) std::copy(a, a + len, dst);
          break;
        }
        case U::SCALE:
          for (size_t i = 0; i < len; ++i) {
            dst[i] = static_cast<float>(alpha * dst[i]);
          }
          break;
        case U::AXPY: {
          const float* a = a_at();
          for (size_t i = 0; i < len; ++i) {
            dst[i] = static_cast<float>(dst[i] + alpha * a[i]);
          }
          break;
        }
        case U::LINCOMB: {
          const float* a = a_at();
          const float* b = b_at();
          for (size_t i = 0; i < len; ++i) {
            dst[i] = static_cast<float>(alpha * a[i] + beta * b[i]);
          }
          break;
        }
        default:
          break;
      }
    }
    for (int j = 0; j < cmd_.dot_x_size(); ++j) {
      const float* x = vectors[cmd_.dot_x(j)] + start;
      const float* y = vectors[cmd_.dot_y(j)] + start;
      double sum = partials[j];
      for (size_t i = 0; i < len; ++i) {
        sum += static_cast<double>(x[i]) * y[i];
      }
      partials[j] = sum;
    }
  }
}

}  // namespace downpour
