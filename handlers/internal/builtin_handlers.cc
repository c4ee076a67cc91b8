#include "handlers/internal/builtin_handlers.h"

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>

namespace downpour {
namespace handlers_internal {
namespace {

// The kernels are written for the auto-vectorizer (check with
// -fopt-info-vec): plain counted loops over float arrays, branch-free
// bodies, no calls but sqrtf (a vector instruction under -fno-math-errno,
// set in BUILD), and restrict-qualified parameters so that the compiler need
// not version the loop against aliasing (GCC ignores restrict on local
// copies). Where a row carries more than one state array, the outer loop is
// over rows and the kernel runs over one row's width.

void SumKernel(float* __restrict w, const float* __restrict g, size_t n) {
  for (size_t i = 0; i < n; ++i) w[i] += g[i];
}

void SgdKernel(float* __restrict w, const float* __restrict g, size_t n,
               float lr) {
  for (size_t i = 0; i < n; ++i) w[i] -= lr * g[i];
}

void MomentumKernel(float* __restrict w, float* __restrict v,
                    const float* __restrict g, size_t n, float lr, float mu) {
  for (size_t i = 0; i < n; ++i) {
    const float vi = mu * v[i] + g[i];
    v[i] = vi;
    w[i] -= lr * vi;
  }
}

// Adagrad in the widest vectors the server's CPU has: a width-64 row's
// square roots and divisions are most of its push when the row is in
// cache. One body, compiled for each target; the handler picks one when it
// is made (an explicit choice, not an ifunc: ThreadSanitizer's runtime is
// not up yet when the loader runs ifunc resolvers). Every version rounds
// alike (IEEE add, multiply, divide and square root, no fused multiply-add:
// -ffp-contract=off in BUILD), so that replicas on different CPUs hold the
// same bits.
using AdagradFn = void (*)(float*, float*, const float*, size_t, float, float);

inline __attribute__((always_inline)) void AdagradBody(
    float* __restrict w, float* __restrict h, const float* __restrict g,
    size_t n, float lr, float eps) {
  for (size_t i = 0; i < n; ++i) {
    const float gi = g[i];
    const float hi = h[i] + gi * gi;
    h[i] = hi;
    w[i] -= lr * gi / (std::sqrt(hi) + eps);
  }
}

void AdagradKernel(float* __restrict w, float* __restrict h,
                   const float* __restrict g, size_t n, float lr, float eps) {
  AdagradBody(w, h, g, n, lr, eps);
}

#if defined(__x86_64__)
__attribute__((target("avx2"))) void AdagradKernelAvx2(
    float* __restrict w, float* __restrict h, const float* __restrict g,
    size_t n, float lr, float eps) {
  AdagradBody(w, h, g, n, lr, eps);
}

__attribute__((target("avx512f"))) void AdagradKernelAvx512(
    float* __restrict w, float* __restrict h, const float* __restrict g,
    size_t n, float lr, float eps) {
  AdagradBody(w, h, g, n, lr, eps);
}

AdagradFn WidestAdagradKernel() {
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f")) return AdagradKernelAvx512;
  if (__builtin_cpu_supports("avx2")) return AdagradKernelAvx2;
  return AdagradKernel;
}
#else
AdagradFn WidestAdagradKernel() { return AdagradKernel; }
#endif

// What every built-in rule shares: a keyed push to a dense range calls the
// rule's own Apply per row directly (inlined, not through the vtable), with
// the rows a few keys ahead prefetched (keys of a batch are sorted but may
// be far apart).
template <typename Rule>
class BuiltinHandler : public UpdateHandler {
 public:
  void ApplyScattered(float* values, float* state, const uint64_t* rows,
                      uint64_t base, size_t n, const float* grads,
                      size_t width) const final {
    const Rule& rule = static_cast<const Rule&>(*this);
    const size_t sw = rule.Rule::StateWidth(width);
    constexpr size_t kAhead = 8;
    for (size_t i = 0; i < n; ++i) {
      if (i + kAhead < n) {
        const size_t ahead = rows[i + kAhead] - base;
        __builtin_prefetch(values + ahead * width, 1);
        if (sw != 0) __builtin_prefetch(state + ahead * sw, 1);
      }
      const size_t r = rows[i] - base;
      rule.Rule::Apply(values + r * width, sw != 0 ? state + r * sw : nullptr,
                       grads + i * width, 1, width);
    }
  }
};

class AssignHandler final : public BuiltinHandler<AssignHandler> {
 public:
  const std::string& name() const override { return name_; }
  size_t StateWidth(size_t) const override { return 0; }
  void InitState(float*, size_t, size_t) const override {}
  void Apply(float* values, float*, const float* grads, size_t rows,
             size_t width) const override {
    std::memcpy(values, grads, rows * width * sizeof(float));
  }

 private:
  const std::string name_ = "assign";
};

class SumHandler final : public BuiltinHandler<SumHandler> {
 public:
  const std::string& name() const override { return name_; }
  size_t StateWidth(size_t) const override { return 0; }
  void InitState(float*, size_t, size_t) const override {}
  void Apply(float* values, float*, const float* grads, size_t rows,
             size_t width) const override {
    SumKernel(values, grads, rows * width);
  }

 private:
  const std::string name_ = "sum";
};

class SgdHandler final : public BuiltinHandler<SgdHandler> {
 public:
  explicit SgdHandler(float learning_rate) : lr_(learning_rate) {}
  const std::string& name() const override { return name_; }
  size_t StateWidth(size_t) const override { return 0; }
  void InitState(float*, size_t, size_t) const override {}
  void Apply(float* values, float*, const float* grads, size_t rows,
             size_t width) const override {
    SgdKernel(values, grads, rows * width, lr_);
  }

 private:
  const std::string name_ = "sgd";
  const float lr_;
};

// State: the velocity, one float per value, so that rows of values and rows
// of state line up and a batch is one flat loop.
class MomentumHandler final : public BuiltinHandler<MomentumHandler> {
 public:
  MomentumHandler(float learning_rate, float momentum)
      : lr_(learning_rate), mu_(momentum) {}
  const std::string& name() const override { return name_; }
  size_t StateWidth(size_t width) const override { return width; }
  void InitState(float* state, size_t rows, size_t width) const override {
    std::memset(state, 0, rows * width * sizeof(float));
  }
  void Apply(float* values, float* state, const float* grads, size_t rows,
             size_t width) const override {
    MomentumKernel(values, state, grads, rows * width, lr_, mu_);
  }

 private:
  const std::string name_ = "momentum";
  const float lr_, mu_;
};

// State: the sum of squared gradients, one float per value.
class AdagradHandler final : public BuiltinHandler<AdagradHandler> {
 public:
  AdagradHandler(float learning_rate, float initial_accumulator, float epsilon)
      : lr_(learning_rate),
        init_(initial_accumulator),
        eps_(epsilon),
        kernel_(WidestAdagradKernel()) {}
  const std::string& name() const override { return name_; }
  size_t StateWidth(size_t width) const override { return width; }
  void InitState(float* state, size_t rows, size_t width) const override {
    std::fill_n(state, rows * width, init_);
  }
  void Apply(float* values, float* state, const float* grads, size_t rows,
             size_t width) const override {
    kernel_(values, state, grads, rows * width, lr_, eps_);
  }

 private:
  const std::string name_ = "adagrad";
  const float lr_, init_, eps_;
  const AdagradFn kernel_;
};

// State: one float per row, the running sum of the row's mean squared
// gradient. The mean is summed in double (a row is short, and the sum must
// not depend on how the compiler vectorizes it: batch and row-at-a-time
// Apply give the same bits either way); the step is one multiplier per row.
class RowwiseAdagradHandler final
    : public BuiltinHandler<RowwiseAdagradHandler> {
 public:
  RowwiseAdagradHandler(float learning_rate, float initial_accumulator,
                        float epsilon)
      : lr_(learning_rate), init_(initial_accumulator), eps_(epsilon) {}
  const std::string& name() const override { return name_; }
  size_t StateWidth(size_t) const override { return 1; }
  void InitState(float* state, size_t rows, size_t) const override {
    std::fill_n(state, rows, init_);
  }
  void Apply(float* values, float* state, const float* grads, size_t rows,
             size_t width) const override {
    if (width == 0) return;
    for (size_t r = 0; r < rows; ++r) {
      const float* g = grads + r * width;
      double sum = 0;
      for (size_t i = 0; i < width; ++i) {
        sum += static_cast<double>(g[i]) * g[i];
      }
      const float acc =
          state[r] + static_cast<float>(sum / static_cast<double>(width));
      state[r] = acc;
      SgdKernel(values + r * width, g, width, lr_ / (std::sqrt(acc) + eps_));
    }
  }

 private:
  const std::string name_ = "rowwise_adagrad";
  const float lr_, init_, eps_;
};

// State per row: m[width], v[width], then the row's step count t. t is a
// uint32 stored bit for bit in the last float (hence "copy state bitwise"):
// a float count would stop at 2^24 steps, where 1 - beta2^t is still
// visibly below 1 for beta2 close to 1. It saturates at 0x7F7FFFFF (about
// 2.1e9 steps, far past where both corrections are exactly 1) so that the
// slot always holds the bits of a finite float.
class AdamHandler final : public BuiltinHandler<AdamHandler> {
 public:
  AdamHandler(float learning_rate, double beta1, double beta2, float epsilon)
      : lr_(learning_rate),
        log_beta1_(std::log(beta1)),
        log_beta2_(std::log(beta2)),
        b1_(static_cast<float>(beta1)),
        b2_(static_cast<float>(beta2)),
        one_minus_b1_(static_cast<float>(1.0 - beta1)),
        one_minus_b2_(static_cast<float>(1.0 - beta2)),
        eps_(epsilon),
        converged_steps_(FindConvergedSteps()) {}
  const std::string& name() const override { return name_; }
  size_t StateWidth(size_t width) const override { return 2 * width + 1; }
  void InitState(float* state, size_t rows, size_t width) const override {
    // All-zero bits are m = v = 0 and t = 0.
    std::memset(state, 0, rows * StateWidth(width) * sizeof(float));
  }
  void Apply(float* values, float* state, const float* grads, size_t rows,
             size_t width) const override {
    const size_t sw = StateWidth(width);
    for (size_t r = 0; r < rows; ++r) {
      float* row_state = state + r * sw;
      uint32_t t;
      std::memcpy(&t, row_state + 2 * width, sizeof(t));
      if (t < kMaxSteps) ++t;
      std::memcpy(row_state + 2 * width, &t, sizeof(t));
      const Factors f =
          t >= converged_steps_ ? Factors{lr_, 1.0f} : ComputeFactors(t);
      RowKernel(values + r * width, row_state, row_state + width,
                grads + r * width, width, f.step, f.inv_bc2);
    }
  }

 private:
  static constexpr uint32_t kMaxSteps = 0x7F7FFFFF;

  // w -= lr * (m / bc1) / (sqrt(v / bc2) + eps) with bc = 1 - beta^t, the
  // per-row factors folded once: step = lr / bc1, inv_bc2 = 1 / bc2.
  // -expm1(t log beta) is 1 - beta^t without the cancellation of
  // 1 - pow(beta, t) for small t, and is cheaper than pow.
  struct Factors {
    float step;
    float inv_bc2;
  };
  Factors ComputeFactors(uint32_t t) const {
    const double td = static_cast<double>(t);
    const double bc1 = -std::expm1(td * log_beta1_);
    const double bc2 = -std::expm1(td * log_beta2_);
    return {static_cast<float>(lr_ / bc1), static_cast<float>(1.0 / bc2)};
  }

  // Both factors decrease with t towards (lr, 1) and, as floats, reach them
  // exactly after a few thousand steps (about 17,000 for beta2 = 0.999).
  // From that step on Apply skips the two expm1 calls per row, which
  // dominate the cost of narrow rows; the result is the same bits.
  uint32_t FindConvergedSteps() const {
    auto converged = [this](uint32_t t) {
      const Factors f = ComputeFactors(t);
      return f.step == lr_ && f.inv_bc2 == 1.0f;
    };
    if (!converged(kMaxSteps)) return kMaxSteps + 1;  // never
    uint32_t lo = 1, hi = kMaxSteps;
    while (lo < hi) {
      const uint32_t mid = lo + (hi - lo) / 2;
      if (converged(mid)) {
        hi = mid;
      } else {
        lo = mid + 1;
      }
    }
    return lo;
  }

  void RowKernel(float* __restrict w, float* __restrict m, float* __restrict v,
                 const float* __restrict g, size_t width, float step,
                 float inv_bc2) const {
    const float b1 = b1_, b2 = b2_, c1 = one_minus_b1_, c2 = one_minus_b2_;
    const float eps = eps_;
    for (size_t i = 0; i < width; ++i) {
      const float gi = g[i];
      const float mi = b1 * m[i] + c1 * gi;
      const float vi = b2 * v[i] + c2 * gi * gi;
      m[i] = mi;
      v[i] = vi;
      w[i] -= step * mi / (std::sqrt(vi * inv_bc2) + eps);
    }
  }

  const std::string name_ = "adam";
  const float lr_;
  const double log_beta1_, log_beta2_;  // -inf for beta = 0: factor 1
  const float b1_, b2_, one_minus_b1_, one_minus_b2_, eps_;
  const uint32_t converged_steps_;
};

// State per row: z[width], n[width]. The weight is a function of (z, n), so
// the first push replaces whatever the initializer or a PUT wrote.
class FtrlHandler final : public BuiltinHandler<FtrlHandler> {
 public:
  FtrlHandler(float alpha, float beta, float l1, float l2)
      : inv_alpha_(1.0f / alpha), beta_(beta), l1_(l1), l2_(l2) {}
  const std::string& name() const override { return name_; }
  size_t StateWidth(size_t width) const override { return 2 * width; }
  void InitState(float* state, size_t rows, size_t width) const override {
    std::memset(state, 0, rows * StateWidth(width) * sizeof(float));
  }
  void Apply(float* values, float* state, const float* grads, size_t rows,
             size_t width) const override {
    const size_t sw = StateWidth(width);
    for (size_t r = 0; r < rows; ++r) {
      float* row_state = state + r * sw;
      RowKernel(values + r * width, row_state, row_state + width,
                grads + r * width, width);
    }
  }

 private:
  void RowKernel(float* __restrict w, float* __restrict z, float* __restrict n,
                 const float* __restrict g, size_t width) const {
    const float inv_alpha = inv_alpha_, beta = beta_, l1 = l1_, l2 = l2_;
    for (size_t i = 0; i < width; ++i) {
      const float gi = g[i];
      const float sqrt_old = std::sqrt(n[i]);
      const float n_new = n[i] + gi * gi;
      const float sqrt_new = std::sqrt(n_new);
      // sigma = (sqrt(n + g^2) - sqrt(n)) / alpha, rewritten as
      // g^2 / (sqrt(n + g^2) + sqrt(n)) / alpha: the difference of two close
      // square roots loses most of its digits once n is large. FLT_MIN keeps
      // 0/0 (g = 0 on a fresh row) at 0 without a branch.
      const float sigma = gi * gi / (sqrt_new + sqrt_old + FLT_MIN) * inv_alpha;
      const float zi = z[i] + gi - sigma * w[i];
      z[i] = zi;
      n[i] = n_new;
      // w = 0 if |z| <= l1, else -(z - sign(z) l1) / ((beta + sqrt(n)) /
      // alpha + l2), written as -sign(z) max(|z| - l1, 0) / denominator:
      // GCC does not vectorize the select-between-quotients form. The
      // denominator is 0 only on a row that has seen nothing but zero
      // gradients (n = 0, with beta = l2 = 0), where z = 0: FLT_MIN turns
      // that 0/0 into 0. Adding +0 turns the -0 of a positive z into +0.
      const float excess = std::fabs(zi) - l1;
      const float magnitude = excess > 0.0f ? excess : 0.0f;
      w[i] = -std::copysign(magnitude, zi) /
                 ((beta + sqrt_new) * inv_alpha + l2 + FLT_MIN) +
             0.0f;
    }
  }

  const std::string name_ = "ftrl";
  const float inv_alpha_, beta_, l1_, l2_;
};

}  // namespace

std::unique_ptr<UpdateHandler> NewAssignHandler() {
  return std::make_unique<AssignHandler>();
}
std::unique_ptr<UpdateHandler> NewSumHandler() {
  return std::make_unique<SumHandler>();
}
std::unique_ptr<UpdateHandler> NewSgdHandler(float learning_rate) {
  return std::make_unique<SgdHandler>(learning_rate);
}
std::unique_ptr<UpdateHandler> NewMomentumHandler(float learning_rate,
                                                  float momentum) {
  return std::make_unique<MomentumHandler>(learning_rate, momentum);
}
std::unique_ptr<UpdateHandler> NewAdagradHandler(float learning_rate,
                                                 float initial_accumulator,
                                                 float epsilon) {
  return std::make_unique<AdagradHandler>(learning_rate, initial_accumulator,
                                          epsilon);
}
std::unique_ptr<UpdateHandler> NewRowwiseAdagradHandler(
    float learning_rate, float initial_accumulator, float epsilon) {
  return std::make_unique<RowwiseAdagradHandler>(learning_rate,
                                                 initial_accumulator, epsilon);
}
std::unique_ptr<UpdateHandler> NewAdamHandler(float learning_rate, double beta1,
                                              double beta2, float epsilon) {
  return std::make_unique<AdamHandler>(learning_rate, beta1, beta2, epsilon);
}
std::unique_ptr<UpdateHandler> NewFtrlHandler(float alpha, float beta, float l1,
                                              float l2) {
  return std::make_unique<FtrlHandler>(alpha, beta, l1, l2);
}

}  // namespace handlers_internal
}  // namespace downpour
