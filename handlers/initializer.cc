#include "handlers/initializer.h"

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/random.h"

namespace downpour {
namespace {

// Odd multipliers: bijections on 64-bit words that spread small keys and
// columns over all bits before they are mixed.
constexpr uint64_t kKeyMultiplier = 0xD1B54A32D192ED03ULL;
constexpr uint64_t kColumnMultiplier = 0xAEF17502108EF2D9ULL;

// SplitMix64 (common/random.h) of (seed, key, column) gives
// independent-looking uniforms with no generator state.
inline uint64_t RowHash(uint64_t seed, Key key) {
  return SplitMix64(seed ^ (key * kKeyMultiplier));
}

inline uint64_t ColumnHash(uint64_t row_hash, uint64_t column) {
  return SplitMix64(row_hash ^ (column * kColumnMultiplier));
}

constexpr double kTwoPi = 6.283185307179586476925286766559;

absl::Status CheckFinite(const char* what, float value) {
  if (std::isfinite(value)) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat("initializer ", what, " is ", value, ", not finite"));
}

}  // namespace

absl::StatusOr<Initializer> Initializer::Create(
    const proto::InitializerSpec& spec) {
  switch (spec.kind()) {
    case proto::InitializerSpec::ZEROS:
      return Initializer(spec.kind(), 0, 0, spec.seed());
    case proto::InitializerSpec::CONSTANT: {
      absl::Status s = CheckFinite("value", spec.value());
      if (!s.ok()) return s;
      return Initializer(spec.kind(), spec.value(), 0, spec.seed());
    }
    case proto::InitializerSpec::UNIFORM: {
      absl::Status s = CheckFinite("low", spec.low());
      if (s.ok()) s = CheckFinite("high", spec.high());
      if (!s.ok()) return s;
      if (spec.high() < spec.low()) {
        return absl::InvalidArgumentError(
            absl::StrCat("uniform initializer has high ", spec.high(),
                         " < low ", spec.low()));
      }
      return Initializer(spec.kind(), spec.low(), spec.high(), spec.seed());
    }
    case proto::InitializerSpec::NORMAL: {
      absl::Status s = CheckFinite("mean", spec.mean());
      if (s.ok()) s = CheckFinite("stddev", spec.stddev());
      if (!s.ok()) return s;
      if (spec.stddev() < 0) {
        return absl::InvalidArgumentError(absl::StrCat(
            "normal initializer has stddev ", spec.stddev(), " < 0"));
      }
      // Box-Muller from 53-bit uniforms never goes beyond 8.6 deviations.
      if (std::abs(static_cast<double>(spec.mean())) +
              9.0 * static_cast<double>(spec.stddev()) >
          FLT_MAX) {
        return absl::InvalidArgumentError(absl::StrCat(
            "normal initializer (mean ", spec.mean(), ", stddev ",
            spec.stddev(), ") would produce values beyond the float range"));
      }
      return Initializer(spec.kind(), spec.mean(), spec.stddev(), spec.seed());
    }
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("unknown initializer kind ", spec.kind()));
  }
}

void Initializer::Fill(Key first_key, size_t rows, size_t width,
                       float* out) const {
  switch (kind_) {
    case proto::InitializerSpec::ZEROS:
      std::memset(out, 0, rows * width * sizeof(float));
      return;
    case proto::InitializerSpec::CONSTANT:
      std::fill_n(out, rows * width, static_cast<float>(a_));
      return;
    default:
      for (size_t r = 0; r < rows; ++r) {
        FillRow(first_key + r, width, out + r * width);
      }
  }
}

void Initializer::FillRow(Key key, size_t width, float* out) const {
  switch (kind_) {
    case proto::InitializerSpec::ZEROS:
      std::memset(out, 0, width * sizeof(float));
      return;
    case proto::InitializerSpec::CONSTANT:
      std::fill_n(out, width, static_cast<float>(a_));
      return;
    case proto::InitializerSpec::UNIFORM: {
      const uint64_t row = RowHash(seed_, key);
      const double low = a_, span = b_ - a_;
      const float high = static_cast<float>(b_);
      // Rounding to float can land on `high` itself; step back below it to
      // keep the interval half-open (unless it is empty: low == high).
      const float below_high =
          span > 0 ? std::nextafter(high, -INFINITY) : high;
      for (size_t c = 0; c < width; ++c) {
        const float v =
            static_cast<float>(low + span * Uniform01(ColumnHash(row, c)));
        out[c] = v < high ? v : below_high;
      }
      return;
    }
    case proto::InitializerSpec::NORMAL: {
      const uint64_t row = RowHash(seed_, key);
      const double mean = a_, stddev = b_;
      // One Box-Muller transform per pair of columns (2p, 2p + 1): cos for
      // the even column, sin for the odd one. Column c's value depends on
      // c only, not on the width.
      for (size_t c = 0; c < width; c += 2) {
        const uint64_t h1 = ColumnHash(row, c / 2);
        const uint64_t h2 = SplitMix64(h1);
        const double u1 = static_cast<double>((h1 >> 11) + 1) * 0x1.0p-53;
        const double radius = std::sqrt(-2.0 * std::log(u1));
        const double theta = kTwoPi * Uniform01(h2);
        out[c] = static_cast<float>(mean + stddev * radius * std::cos(theta));
        if (c + 1 < width) {
          out[c + 1] =
              static_cast<float>(mean + stddev * radius * std::sin(theta));
        }
      }
      return;
    }
    default:
      return;  // unreachable: Create accepts only the kinds above
  }
}

}  // namespace downpour
