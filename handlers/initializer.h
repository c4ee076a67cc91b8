// Initial values of table rows, from a table's InitializerSpec.
//
//   DP_ASSIGN_OR_RETURN(Initializer init, Initializer::Create(spec.init()));
//   init.Fill(range.begin, rows, width, values);  // a dense range
//   init.FillRow(key, width, row);                // a sparse row, on first
//   touch
//
// Values are a pure function of (seed, key, column): independent of which
// server holds the key, of the order rows are first touched, of batching,
// and of the row width (column c of a row is the same whatever the width),
// so rows move between servers and get re-created after a restart without
// changing. Random values come from a counter-based hash (splitmix64 of
// seed, key and column), not from a stateful generator. NORMAL goes through
// the C library's log, sin and cos: servers built against the same libm
// produce bit-identical rows.
//
// Kinds: ZEROS; CONSTANT(value); UNIFORM in [low, high) (all `low` when
// low == high); NORMAL(mean, stddev) by Box-Muller.
//
// A small value type: copyable, thread-safe (const after Create).
#ifndef DOWNPOUR_HANDLERS_INITIALIZER_H_
#define DOWNPOUR_HANDLERS_INITIALIZER_H_

#include <cstddef>
#include <cstdint>

#include "absl/status/statusor.h"
#include "common/types.h"
#include "proto/downpour.pb.h"

namespace downpour {

class Initializer {
 public:
  // kInvalidArgument for an unknown kind, a non-finite value, low or high,
  // mean or stddev, high < low, stddev < 0, or a distribution whose values
  // would overflow a float (|mean| + 9 * stddev > FLT_MAX).
  static absl::StatusOr<Initializer> Create(const proto::InitializerSpec& spec);

  // Fills `rows` rows of the consecutive keys first_key, first_key + 1, ...
  // into out[rows * width]. Same values as FillRow on each key.
  void Fill(Key first_key, size_t rows, size_t width, float* out) const;

  // Fills the row of `key` into out[width].
  void FillRow(Key key, size_t width, float* out) const;

 private:
  using Kind = proto::InitializerSpec::Kind;
  // a, b: CONSTANT value; UNIFORM low, high; NORMAL mean, stddev.
  Initializer(Kind kind, double a, double b, uint64_t seed)
      : kind_(kind), a_(a), b_(b), seed_(seed) {}

  Kind kind_;
  double a_;
  double b_;
  uint64_t seed_;
};

}  // namespace downpour

#endif  // DOWNPOUR_HANDLERS_INITIALIZER_H_
