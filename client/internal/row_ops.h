// Copying and adding rows of floats of a table's width, for the SDK's
// gathers, scatters and sums: fixed widths compile to a few vector moves
// instead of a call to memcpy or a loop with a count a row.
//
//   const RowOp copy = RowCopyFor(width), add = RowAddFor(width);
//   copy(dst, src, width);  // dst[0, width) = src[0, width)
//   add(dst, src, width);   // dst[0, width) += src[0, width)
//
// Thread-safe: pure functions.
#ifndef DOWNPOUR_CLIENT_INTERNAL_ROW_OPS_H_
#define DOWNPOUR_CLIENT_INTERNAL_ROW_OPS_H_

#include <cstddef>
#include <cstring>
#include <type_traits>

namespace downpour {

using RowOp = void (*)(float* dst, const float* src, size_t width);

namespace row_ops_internal {

// Apply<kWidth>: a row of kWidth floats (0: `width`).
struct Copy {
  template <size_t kWidth>
  static void Apply(float* dst, const float* src, size_t width) {
    std::memcpy(dst, src, (kWidth > 0 ? kWidth : width) * sizeof(float));
  }
};
struct Add {
  template <size_t kWidth>
  static void Apply(float* dst, const float* src, size_t width) {
    const size_t w = kWidth > 0 ? kWidth : width;
    for (size_t c = 0; c < w; ++c) dst[c] += src[c];
  }
};

}  // namespace row_ops_internal

// Returns fn(std::integral_constant<size_t, kWidth>()) with kWidth = width
// for the widths with a version of their own (1, 2, 4, ..., 64), 0 for the
// others: a loop over rows in fn, compiled once for each, then copies and
// adds its rows with Copy::Apply<kWidth> and Add::Apply<kWidth> inline
// instead of through a call a row.
template <typename F>
decltype(auto) WithFixedWidth(size_t width, F fn) {
  switch (width) {
    case 1:
      return fn(std::integral_constant<size_t, 1>());
    case 2:
      return fn(std::integral_constant<size_t, 2>());
    case 4:
      return fn(std::integral_constant<size_t, 4>());
    case 8:
      return fn(std::integral_constant<size_t, 8>());
    case 16:
      return fn(std::integral_constant<size_t, 16>());
    case 32:
      return fn(std::integral_constant<size_t, 32>());
    case 64:
      return fn(std::integral_constant<size_t, 64>());
    default:
      return fn(std::integral_constant<size_t, 0>());
  }
}

namespace row_ops_internal {
template <class Op>
RowOp For(size_t width) {
  return WithFixedWidth(width, [](auto fixed) -> RowOp {
    return &Op::template Apply<decltype(fixed)::value>;
  });
}
}  // namespace row_ops_internal

inline RowOp RowCopyFor(size_t width) {
  return row_ops_internal::For<row_ops_internal::Copy>(width);
}
inline RowOp RowAddFor(size_t width) {
  return row_ops_internal::For<row_ops_internal::Add>(width);
}

}  // namespace downpour

#endif  // DOWNPOUR_CLIENT_INTERNAL_ROW_OPS_H_
