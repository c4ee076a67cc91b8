#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "common/test_util.h"
#include "handlers/handler.h"
#include "handlers/plugin_registry.h"

namespace downpour {
namespace {

using ::testing::HasSubstr;

proto::HandlerSpec Spec(const std::string& name,
                        const std::map<std::string, double>& params = {}) {
  proto::HandlerSpec spec;
  spec.set_name(name);
  for (const auto& [k, v] : params) (*spec.mutable_params())[k] = v;
  return spec;
}

// An independent double-precision model of each rule, written from the
// formulas in handler.h: per element, straightforward, no shared code with
// the kernels.
class Reference {
 public:
  Reference(std::string name, std::map<std::string, double> params, size_t rows,
            size_t width)
      : name_(std::move(name)),
        p_(std::move(params)),
        rows_(rows),
        width_(width),
        a_(rows * width, 0.0),
        b_(rows * width, 0.0),
        t_(rows, 0) {
    if (name_ == "adagrad" || name_ == "rowwise_adagrad") {
      std::fill(a_.begin(), a_.end(), Param("initial_accumulator", 0.0));
    }
  }

  void Step(std::vector<double>& w, const std::vector<double>& g) {
    for (size_t r = 0; r < rows_; ++r) {
      ++t_[r];
      if (name_ == "rowwise_adagrad") {
        // One accumulator per row (kept in a_[r * width_]).
        double mean_sq = 0;
        for (size_t j = 0; j < width_; ++j) {
          mean_sq += g[r * width_ + j] * g[r * width_ + j];
        }
        double& h = a_[r * width_];
        h += mean_sq / width_;
        for (size_t j = 0; j < width_; ++j) {
          w[r * width_ + j] -= Param("learning_rate", 0.01) *
                               g[r * width_ + j] /
                               (std::sqrt(h) + Param("epsilon", 1e-8));
        }
        continue;
      }
      for (size_t j = 0; j < width_; ++j) {
        const size_t i = r * width_ + j;
        StepElement(&w[i], &a_[i], &b_[i], g[i], t_[r]);
      }
    }
  }

 private:
  double Param(const std::string& key, double def) const {
    auto it = p_.find(key);
    return it == p_.end() ? def : it->second;
  }

  void StepElement(double* w, double* a, double* b, double g, int t) const {
    if (name_ == "assign") {
      *w = g;
    } else if (name_ == "sum") {
      *w += g;
    } else if (name_ == "sgd") {
      *w -= Param("learning_rate", 0.01) * g;
    } else if (name_ == "momentum") {
      *a = Param("momentum", 0.9) * *a + g;
      *w -= Param("learning_rate", 0.01) * *a;
    } else if (name_ == "adagrad") {
      *a += g * g;
      *w -= Param("learning_rate", 0.01) * g /
            (std::sqrt(*a) + Param("epsilon", 1e-8));
    } else if (name_ == "adam") {
      const double b1 = Param("beta1", 0.9), b2 = Param("beta2", 0.999);
      *a = b1 * *a + (1 - b1) * g;
      *b = b2 * *b + (1 - b2) * g * g;
      const double m_hat = *a / (1 - std::pow(b1, t));
      const double v_hat = *b / (1 - std::pow(b2, t));
      *w -= Param("learning_rate", 0.001) * m_hat /
            (std::sqrt(v_hat) + Param("epsilon", 1e-8));
    } else if (name_ == "ftrl") {
      const double alpha = Param("alpha", 0.05), beta = Param("beta", 1.0);
      const double l1 = Param("l1", 0.0), l2 = Param("l2", 0.0);
      double& z = *a;
      double& n = *b;
      const double sigma = (std::sqrt(n + g * g) - std::sqrt(n)) / alpha;
      z += g - sigma * *w;
      n += g * g;
      if (std::abs(z) <= l1) {
        *w = 0;
      } else {
        const double sign = z > 0 ? 1.0 : -1.0;
        *w = -(z - sign * l1) / ((beta + std::sqrt(n)) / alpha + l2);
      }
    } else {
      ADD_FAILURE() << "no reference for " << name_;
    }
  }

  const std::string name_;
  const std::map<std::string, double> p_;
  const size_t rows_, width_;
  std::vector<double> a_, b_;
  std::vector<int> t_;
};

struct Case {
  std::string name;
  std::map<std::string, double> params;
};

std::vector<Case> AllCases() {
  return {
      {"assign", {}},
      {"sum", {}},
      {"sgd", {}},
      {"sgd", {{"learning_rate", 0.3}}},
      {"momentum", {}},
      {"momentum", {{"learning_rate", 0.1}, {"momentum", 0.5}}},
      {"adagrad", {}},
      {"adagrad",
       {{"learning_rate", 0.2}, {"initial_accumulator", 0.1}, {"epsilon", 0}}},
      {"rowwise_adagrad", {}},
      {"rowwise_adagrad",
       {{"learning_rate", 0.2}, {"initial_accumulator", 0.1}, {"epsilon", 0}}},
      {"adam", {}},
      {"adam",
       {{"learning_rate", 0.05},
        {"beta1", 0.5},
        {"beta2", 0.9},
        {"epsilon", 1e-3}}},
      {"ftrl", {}},
      {"ftrl", {{"alpha", 0.5}, {"beta", 0.5}, {"l1", 0.3}, {"l2", 0.2}}},
  };
}

std::string CaseName(const Case& c) {
  std::string s = c.name;
  for (const auto& [k, v] : c.params) s += " " + k + "=" + std::to_string(v);
  return s;
}

// Every built-in rule against its reference: 4 rows, widths 1, 3 and 17,
// 8 steps of random gradients (a zero gradient among them), alternating
// between whole-batch and row-at-a-time Apply.
TEST(HandlersTest, MatchesDoublePrecisionReference) {
  const uint32_t seed = TestSeed(1);
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> init_dist(-1.0f, 1.0f);
  std::uniform_real_distribution<float> grad_dist(-2.0f, 2.0f);
  constexpr size_t kRows = 4;
  constexpr int kSteps = 8;
  for (const Case& c : AllCases()) {
    for (size_t width : {1, 3, 17}) {
      SCOPED_TRACE(CaseName(c) + " width " + std::to_string(width));
      auto handler = CreateHandler(Spec(c.name, c.params), nullptr);
      ASSERT_OK(handler);
      const size_t n = kRows * width;
      const size_t sw = (*handler)->StateWidth(width);
      std::vector<float> values(n), state(kRows * sw + 1), grads(n);
      std::vector<double> ref_values(n), ref_grads(n);
      for (size_t i = 0; i < n; ++i) {
        values[i] = init_dist(rng);
        ref_values[i] = values[i];
      }
      (*handler)->InitState(state.data(), kRows, width);
      Reference ref(c.name, c.params, kRows, width);
      for (int step = 0; step < kSteps; ++step) {
        for (size_t i = 0; i < n; ++i) {
          grads[i] = (i + step) % 7 == 0 ? 0.0f : grad_dist(rng);
          ref_grads[i] = grads[i];
        }
        if (step % 2 == 0) {
          (*handler)->Apply(values.data(), sw ? state.data() : nullptr,
                            grads.data(), kRows, width);
        } else {
          for (size_t r = 0; r < kRows; ++r) {
            (*handler)->Apply(values.data() + r * width,
                              sw ? state.data() + r * sw : nullptr,
                              grads.data() + r * width, 1, width);
          }
        }
        ref.Step(ref_values, ref_grads);
        for (size_t i = 0; i < n; ++i) {
          ASSERT_NEAR(values[i], ref_values[i],
                      1e-5 * std::max(1.0, std::abs(ref_values[i])))
              << "step " << step << " element " << i;
        }
      }
    }
  }
}

// The server applies a dense range as one batch and sparse rows one by one:
// both must give the same bits.
TEST(HandlersTest, BatchEqualsRowByRowBitwise) {
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  constexpr size_t kRows = 9, kWidth = 13;
  for (const Case& c : AllCases()) {
    SCOPED_TRACE(CaseName(c));
    auto handler = CreateHandler(Spec(c.name, c.params), nullptr);
    ASSERT_OK(handler);
    const size_t n = kRows * kWidth, sw = (*handler)->StateWidth(kWidth);
    std::vector<float> v1(n), v2, s1(kRows * sw + 1), s2, g(n);
    for (float& x : v1) x = dist(rng);
    v2 = v1;
    (*handler)->InitState(s1.data(), kRows, kWidth);
    s2 = s1;
    for (int step = 0; step < 3; ++step) {
      for (float& x : g) x = dist(rng);
      (*handler)->Apply(v1.data(), s1.data(), g.data(), kRows, kWidth);
      for (size_t r = 0; r < kRows; ++r) {
        (*handler)->Apply(v2.data() + r * kWidth, s2.data() + r * sw,
                          g.data() + r * kWidth, 1, kWidth);
      }
    }
    EXPECT_EQ(0, std::memcmp(v1.data(), v2.data(), n * sizeof(float)));
    EXPECT_EQ(0, std::memcmp(s1.data(), s2.data(), s1.size() * sizeof(float)));
  }
}

// A keyed push to a dense range (ApplyScattered: sorted keys with gaps and
// repeats) gives the bits of Apply row by row, for every built-in rule and
// for the default that plugins get.
TEST(HandlersTest, ScatteredEqualsRowByRowBitwise) {
  std::mt19937 rng(11);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  constexpr size_t kRows = 40;
  constexpr uint64_t kBase = 1000;
  // 30 keys, sorted, with gaps and repeats (a row pushed twice in a batch
  // is applied twice, in order).
  std::vector<uint64_t> keys;
  for (size_t i = 0; keys.size() < 30; ++i) {
    const uint64_t k = kBase + (i * 7) % kRows;
    keys.push_back(k);
    if (i % 5 == 0) keys.push_back(k);
  }
  std::sort(keys.begin(), keys.end());
  // A handler that only has Apply: what a plugin handler inherits.
  class RowOnly final : public UpdateHandler {
   public:
    explicit RowOnly(const UpdateHandler* h) : h_(h) {}
    const std::string& name() const override { return h_->name(); }
    size_t StateWidth(size_t w) const override { return h_->StateWidth(w); }
    void InitState(float* s, size_t r, size_t w) const override {
      h_->InitState(s, r, w);
    }
    void Apply(float* v, float* s, const float* g, size_t r,
               size_t w) const override {
      h_->Apply(v, s, g, r, w);
    }

   private:
    const UpdateHandler* h_;
  };
  for (const Case& c : AllCases()) {
    for (size_t width : {1, 5, 16}) {
      SCOPED_TRACE(CaseName(c) + " width " + std::to_string(width));
      auto handler = CreateHandler(Spec(c.name, c.params), nullptr);
      ASSERT_OK(handler);
      const RowOnly row_only(handler->get());
      const size_t n = kRows * width, sw = (*handler)->StateWidth(width);
      std::vector<float> v1(n), s1(kRows * sw + 1), g(keys.size() * width);
      for (float& x : v1) x = dist(rng);
      (*handler)->InitState(s1.data(), kRows, width);
      const std::vector<float> v0 = v1;
      std::vector<float> v2 = v1, s2 = s1, v3 = v1, s3 = s1;
      for (int step = 0; step < 3; ++step) {
        for (float& x : g) x = dist(rng);
        (*handler)->ApplyScattered(v1.data(), sw ? s1.data() : nullptr,
                                   keys.data(), kBase, keys.size(), g.data(),
                                   width);
        row_only.ApplyScattered(v3.data(), sw ? s3.data() : nullptr,
                                keys.data(), kBase, keys.size(), g.data(),
                                width);
        for (size_t i = 0; i < keys.size(); ++i) {
          const size_t r = keys[i] - kBase;
          (*handler)->Apply(v2.data() + r * width,
                            sw ? s2.data() + r * sw : nullptr,
                            g.data() + i * width, 1, width);
        }
      }
      EXPECT_EQ(0, std::memcmp(v1.data(), v2.data(), n * sizeof(float)));
      EXPECT_EQ(0, std::memcmp(s1.data(), s2.data(), s1.size() * 4));
      EXPECT_EQ(0, std::memcmp(v3.data(), v2.data(), n * sizeof(float)));
      EXPECT_EQ(0, std::memcmp(s3.data(), s2.data(), s3.size() * 4));
      // Keyed rows changed, the others did not.
      for (size_t r = 0; r < kRows; ++r) {
        const bool keyed =
            std::binary_search(keys.begin(), keys.end(), kBase + r);
        EXPECT_EQ(keyed,
                  std::memcmp(v1.data() + r * width, v0.data() + r * width,
                              width * sizeof(float)) != 0)
            << "row " << r;
      }
    }
  }
}

// Apply on disjoint rows from several threads equals one serial pass.
TEST(HandlersTest, ConcurrentApplyOnDisjointRows) {
  auto handler = CreateHandler(Spec("adam", {{"learning_rate", 0.1}}), nullptr);
  ASSERT_OK(handler);
  constexpr size_t kThreads = 4, kRowsPerThread = 64, kWidth = 8;
  constexpr size_t kRows = kThreads * kRowsPerThread;
  const size_t sw = (*handler)->StateWidth(kWidth);
  std::vector<float> serial(kRows * kWidth, 0.5f), grads(kRows * kWidth);
  for (size_t i = 0; i < grads.size(); ++i) grads[i] = 0.001f * (i % 97);
  std::vector<float> parallel = serial;
  std::vector<float> serial_state(kRows * sw), parallel_state(kRows * sw);
  (*handler)->InitState(serial_state.data(), kRows, kWidth);
  (*handler)->InitState(parallel_state.data(), kRows, kWidth);
  for (int step = 0; step < 5; ++step) {
    (*handler)->Apply(serial.data(), serial_state.data(), grads.data(), kRows,
                      kWidth);
    std::vector<std::thread> threads;
    for (size_t t = 0; t < kThreads; ++t) {
      threads.emplace_back([&, t] {
        const size_t first = t * kRowsPerThread;
        (*handler)->Apply(parallel.data() + first * kWidth,
                          parallel_state.data() + first * sw,
                          grads.data() + first * kWidth, kRowsPerThread,
                          kWidth);
      });
    }
    for (std::thread& th : threads) th.join();
  }
  EXPECT_EQ(serial, parallel);
}

TEST(HandlersTest, StateWidths) {
  const std::map<std::string, std::vector<size_t>> expected = {
      // state width for row widths 1, 3, 17
      {"assign", {0, 0, 0}},   {"sum", {0, 0, 0}},
      {"sgd", {0, 0, 0}},      {"momentum", {1, 3, 17}},
      {"adagrad", {1, 3, 17}}, {"adam", {3, 7, 35}},
      {"ftrl", {2, 6, 34}},    {"rowwise_adagrad", {1, 1, 1}},
  };
  for (const auto& [name, widths] : expected) {
    auto handler = CreateHandler(Spec(name), nullptr);
    ASSERT_OK(handler);
    EXPECT_EQ((*handler)->name(), name);
    EXPECT_EQ((*handler)->StateWidth(1), widths[0]) << name;
    EXPECT_EQ((*handler)->StateWidth(3), widths[1]) << name;
    EXPECT_EQ((*handler)->StateWidth(17), widths[2]) << name;
  }
}

TEST(HandlersTest, EmptyNameIsSgd) {
  auto handler = CreateHandler(Spec("", {{"learning_rate", 0.5}}), nullptr);
  ASSERT_OK(handler);
  EXPECT_EQ((*handler)->name(), "sgd");
  float w[2] = {1.0f, 2.0f};
  const float g[2] = {1.0f, -2.0f};
  (*handler)->Apply(w, nullptr, g, 1, 2);
  EXPECT_FLOAT_EQ(w[0], 0.5f);
  EXPECT_FLOAT_EQ(w[1], 3.0f);
}

TEST(HandlersTest, AdagradInitialAccumulator) {
  auto handler =
      CreateHandler(Spec("adagrad", {{"initial_accumulator", 0.25}}), nullptr);
  ASSERT_OK(handler);
  std::vector<float> state(6, -1.0f);
  (*handler)->InitState(state.data(), 2, 3);
  EXPECT_EQ(state, std::vector<float>(6, 0.25f));
}

// Adagrad's kernel runs in the widest vectors the CPU has: every width
// (vector tails too) must give the bits of one float operation at a time,
// in the formula's order, as on a CPU without those vectors.
TEST(HandlersTest, AdagradEqualsScalarFloatsBitwise) {
  const float lr = 0.05f, eps = 1e-6f;
  auto handler = CreateHandler(
      Spec("adagrad", {{"learning_rate", lr}, {"epsilon", eps}}), nullptr);
  ASSERT_OK(handler);
  std::mt19937 rng(TestSeed(3));
  std::normal_distribution<float> normal(0.0f, 3.0f);
  for (size_t width = 1; width <= 100; ++width) {
    std::vector<float> w(width), h(width), g(width);
    for (size_t i = 0; i < width; ++i) {
      w[i] = normal(rng);
      h[i] = std::abs(normal(rng));
    }
    std::vector<float> want_w = w, want_h = h;
    for (int step = 0; step < 3; ++step) {
      for (float& x : g) x = normal(rng);
      (*handler)->Apply(w.data(), h.data(), g.data(), 1, width);
      for (size_t i = 0; i < width; ++i) {
        // Each operation stored as a float, so that nothing is fused or
        // kept wider.
        volatile float sq = g[i] * g[i];
        volatile float acc = want_h[i] + sq;
        volatile float root = std::sqrt(static_cast<float>(acc));
        volatile float den = root + eps;
        volatile float num = lr * g[i];
        volatile float step_size = num / den;
        want_h[i] = acc;
        want_w[i] = want_w[i] - step_size;
      }
    }
    for (size_t i = 0; i < width; ++i) {
      ASSERT_EQ(std::memcmp(&w[i], &want_w[i], sizeof(float)), 0)
          << "width " << width << ", element " << i << ": " << w[i]
          << " != " << want_w[i];
      ASSERT_EQ(std::memcmp(&h[i], &want_h[i], sizeof(float)), 0)
          << "width " << width << ", element " << i;
    }
  }
}

TEST(HandlersTest, ZeroRowsIsANoOp) {
  for (const Case& c : AllCases()) {
    auto handler = CreateHandler(Spec(c.name, c.params), nullptr);
    ASSERT_OK(handler);
    float sentinel[1] = {42.0f};
    float state[1] = {42.0f};
    const float grad[1] = {1.0f};
    (*handler)->InitState(state, 0, 5);
    (*handler)->Apply(sentinel, state, grad, 0, 5);
    EXPECT_EQ(sentinel[0], 42.0f) << CaseName(c);
    EXPECT_EQ(state[0], 42.0f) << CaseName(c);
  }
}

TEST(HandlersTest, UnknownHandlerIsNotFound) {
  EXPECT_THAT(CreateHandler(Spec("adamw"), nullptr),
              StatusIs(absl::StatusCode::kNotFound));
  EXPECT_THAT(CreateHandler(Spec("SGD"), nullptr),
              StatusIs(absl::StatusCode::kNotFound));
  EXPECT_THAT(ValidateHandlerSpec(Spec("adamw"), {}),
              StatusIs(absl::StatusCode::kNotFound));
}

TEST(HandlersTest, PluginWithoutRegistryIsNotFound) {
  EXPECT_THAT(CreateHandler(Spec("plugin:clipped_sgd"), nullptr),
              StatusIs(absl::StatusCode::kNotFound));
  PluginRegistry empty;
  EXPECT_THAT(CreateHandler(Spec("plugin:clipped_sgd"), &empty),
              StatusIs(absl::StatusCode::kNotFound));
}

TEST(HandlersTest, UnknownParameterNamesParamAndHandler) {
  auto handler = CreateHandler(Spec("sgd", {{"learning_rat", 0.1}}), nullptr);
  EXPECT_THAT(handler, StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(std::string(handler.status().message()),
              HasSubstr("learning_rat"));
  EXPECT_THAT(std::string(handler.status().message()), HasSubstr("'sgd'"));
  // Parameters of one rule are unknown to another.
  EXPECT_THAT(CreateHandler(Spec("sgd", {{"momentum", 0.9}}), nullptr),
              StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(CreateHandler(Spec("assign", {{"learning_rate", 1}}), nullptr),
              StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(CreateHandler(Spec("sum", {{"x", 1}}), nullptr),
              StatusIs(absl::StatusCode::kInvalidArgument));
}

TEST(HandlersTest, BadParameterValues) {
  const double kNan = std::nan("");
  const double kInf = INFINITY;
  const std::vector<Case> bad = {
      {"sgd", {{"learning_rate", -0.1}}},
      {"sgd", {{"learning_rate", kNan}}},
      {"sgd", {{"learning_rate", kInf}}},
      {"sgd", {{"learning_rate", 1e300}}},  // finite double, not a float
      {"momentum", {{"learning_rate", -1}}},
      {"momentum", {{"momentum", 1.0}}},
      {"momentum", {{"momentum", -0.1}}},
      {"adagrad", {{"learning_rate", -1}}},
      {"adagrad", {{"initial_accumulator", -0.1}}},
      {"adagrad", {{"epsilon", -1e-8}}},
      {"adagrad", {{"epsilon", 0}}},  // and initial_accumulator 0
      {"rowwise_adagrad", {{"learning_rate", -1}}},
      {"rowwise_adagrad", {{"initial_accumulator", -0.1}}},
      {"rowwise_adagrad", {{"epsilon", 0}}},
      {"rowwise_adagrad", {{"momentum", 0.9}}},
      {"adam", {{"learning_rate", -0.001}}},
      {"adam", {{"beta1", 1.0}}},
      {"adam", {{"beta2", 1.5}}},
      {"adam", {{"beta2", -0.5}}},
      {"adam", {{"epsilon", 0}}},
      {"ftrl", {{"alpha", 0}}},
      {"ftrl", {{"alpha", -0.05}}},
      {"ftrl", {{"beta", -1}}},
      {"ftrl", {{"l1", -0.1}}},
      {"ftrl", {{"l2", -0.1}}},
  };
  for (const Case& c : bad) {
    EXPECT_THAT(CreateHandler(Spec(c.name, c.params), nullptr),
                StatusIs(absl::StatusCode::kInvalidArgument))
        << CaseName(c);
    EXPECT_THAT(ValidateHandlerSpec(Spec(c.name, c.params), {}),
                StatusIs(absl::StatusCode::kInvalidArgument))
        << CaseName(c);
  }
  // Boundary values that are allowed.
  const std::vector<Case> good = {
      {"sgd", {{"learning_rate", 0}}},
      {"momentum", {{"momentum", 0}}},
      {"adagrad", {{"epsilon", 0}, {"initial_accumulator", 0.1}}},
      {"rowwise_adagrad", {{"epsilon", 0}, {"initial_accumulator", 0.1}}},
      {"adam", {{"beta1", 0}, {"beta2", 0}}},
      {"ftrl", {{"beta", 0}, {"l1", 0}, {"l2", 0}}},
  };
  for (const Case& c : good) {
    EXPECT_OK(CreateHandler(Spec(c.name, c.params), nullptr));
    EXPECT_OK(ValidateHandlerSpec(Spec(c.name, c.params), {}));
  }
}

TEST(HandlersTest, ValidateChecksPluginNames) {
  const std::vector<std::string> loaded = {"plugin:clipped_sgd"};
  EXPECT_OK(ValidateHandlerSpec(Spec("plugin:clipped_sgd"), loaded));
  // Plugin parameters are the plugin's business: not checked here.
  EXPECT_OK(
      ValidateHandlerSpec(Spec("plugin:clipped_sgd", {{"zzz", 1}}), loaded));
  EXPECT_THAT(ValidateHandlerSpec(Spec("plugin:other"), loaded),
              StatusIs(absl::StatusCode::kNotFound));
  EXPECT_THAT(ValidateHandlerSpec(Spec("plugin:clipped_sgd"), {}),
              StatusIs(absl::StatusCode::kNotFound));
  EXPECT_OK(ValidateHandlerSpec(Spec(""), {}));
  EXPECT_OK(ValidateHandlerSpec(Spec("ftrl", {{"l1", 1}}), {}));
}

// Row-wise Adagrad keeps one accumulator per row: the mean of the row's
// squared gradients, so every element of a row moves by the same factor.
TEST(HandlersTest, RowwiseAdagradOneAccumulatorPerRow) {
  auto handler = CreateHandler(
      Spec("rowwise_adagrad",
           {{"learning_rate", 0.5}, {"initial_accumulator", 1.0}}),
      nullptr);
  ASSERT_OK(handler);
  ASSERT_EQ((*handler)->StateWidth(4), 1u);
  float w[8] = {0, 0, 0, 0, 1, 1, 1, 1};
  float state[2] = {-1, -1};
  (*handler)->InitState(state, 2, 4);
  EXPECT_EQ(state[0], 1.0f);
  EXPECT_EQ(state[1], 1.0f);
  // Row 0: mean(g^2) = (4 + 4 + 0 + 0) / 4 = 2, h = 3. Row 1: zeros.
  const float g[8] = {2, -2, 0, 0, 0, 0, 0, 0};
  (*handler)->Apply(w, state, g, 2, 4);
  EXPECT_FLOAT_EQ(state[0], 3.0f);
  EXPECT_FLOAT_EQ(state[1], 1.0f);
  const float step = 0.5f / (std::sqrt(3.0f) + 1e-8f);
  EXPECT_FLOAT_EQ(w[0], -2 * step);
  EXPECT_FLOAT_EQ(w[1], 2 * step);
  EXPECT_EQ(w[2], 0.0f);
  for (int i = 4; i < 8; ++i) EXPECT_EQ(w[i], 1.0f);
}

// FTRL with l1 zeroes coordinates whose accumulated gradient stays small,
// which is why it is used for sparse models.
TEST(HandlersTest, FtrlL1ProducesExactZeros) {
  auto handler = CreateHandler(Spec("ftrl", {{"l1", 1.0}}), nullptr);
  ASSERT_OK(handler);
  float w[2] = {0.0f, 0.0f};
  std::vector<float> state((*handler)->StateWidth(2));
  (*handler)->InitState(state.data(), 1, 2);
  const float g[2] = {0.1f, 5.0f};
  (*handler)->Apply(w, state.data(), g, 1, 2);
  EXPECT_EQ(w[0], 0.0f);  // |z| = 0.1 <= l1
  // z = 5, n = 25: w = -(5 - 1) / ((1 + 5) / 0.05).
  EXPECT_FLOAT_EQ(w[1], -4.0f / 120.0f);
}

// With beta = l2 = 0 the FTRL denominator is 0 on a row that has only seen
// zero gradients: the weight must come out as +0, not NaN or -0.
TEST(HandlersTest, FtrlZeroGradientOnFreshRow) {
  auto handler =
      CreateHandler(Spec("ftrl", {{"beta", 0}, {"l1", 0}, {"l2", 0}}), nullptr);
  ASSERT_OK(handler);
  float w[3] = {0.5f, -0.5f, 0.0f};
  std::vector<float> state((*handler)->StateWidth(3));
  (*handler)->InitState(state.data(), 1, 3);
  const float g[3] = {0.0f, 0.0f, 0.0f};
  (*handler)->Apply(w, state.data(), g, 1, 3);
  for (float x : w) {
    EXPECT_EQ(x, 0.0f);
    EXPECT_FALSE(std::signbit(x));
  }
}

// Adam stops computing its bias corrections once they round to exactly 1
// in float; with small betas that happens within a few dozen steps, so a
// long run crosses the switch and must still follow the reference.
TEST(HandlersTest, AdamAcrossBiasCorrectionConvergence) {
  const uint32_t seed = TestSeed(2);
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  const std::map<std::string, double> params = {
      {"learning_rate", 0.01}, {"beta1", 0.5}, {"beta2", 0.6}};
  auto handler = CreateHandler(Spec("adam", params), nullptr);
  ASSERT_OK(handler);
  constexpr size_t kRows = 2, kWidth = 5, kN = kRows * kWidth;
  std::vector<float> w(kN, 0.0f), g(kN);
  std::vector<float> state(kRows * (*handler)->StateWidth(kWidth));
  (*handler)->InitState(state.data(), kRows, kWidth);
  std::vector<double> ref_w(kN, 0.0), ref_g(kN);
  Reference ref("adam", params, kRows, kWidth);
  for (int step = 0; step < 200; ++step) {
    for (size_t i = 0; i < kN; ++i) ref_g[i] = g[i] = dist(rng);
    (*handler)->Apply(w.data(), state.data(), g.data(), kRows, kWidth);
    ref.Step(ref_w, ref_g);
    for (size_t i = 0; i < kN; ++i) {
      ASSERT_NEAR(w[i], ref_w[i], 1e-5 * std::max(1.0, std::abs(ref_w[i])))
          << "step " << step << " element " << i;
    }
  }
}

// Adam's step count lives in the state: after many steps a constant
// gradient moves each weight by about learning_rate per step.
TEST(HandlersTest, AdamLongRun) {
  auto handler =
      CreateHandler(Spec("adam", {{"learning_rate", 0.01}}), nullptr);
  ASSERT_OK(handler);
  float w[3] = {0, 0, 0};
  std::vector<float> state((*handler)->StateWidth(3));
  (*handler)->InitState(state.data(), 1, 3);
  const float g[3] = {1.0f, -1.0f, 1e-3f};
  for (int i = 0; i < 10000; ++i) (*handler)->Apply(w, state.data(), g, 1, 3);
  EXPECT_NEAR(w[0], -100.0f, 0.5f);
  EXPECT_NEAR(w[1], 100.0f, 0.5f);
  EXPECT_NEAR(w[2], -100.0f, 0.5f);
  uint32_t t;
  std::memcpy(&t, &state[6], sizeof(t));
  EXPECT_EQ(t, 10000u);
}

}  // namespace
}  // namespace downpour
