// Server-side vector algebra: the kernels behind the data plane's VECTOR
// operation (proto::VectorCommand), which Sandblaster L-BFGS uses to keep its
// vectors on the servers.
//
// A table may hold several named vectors over the same key ranges
// (TableSpec.vectors; vector 0 is the parameters the update handler
// changes). A command names vectors by index and runs, like an update
// handler, on contiguous runs of rows next to the data: first an optional
// update of one vector, then any number of dot products, fused in one pass
// so that "d -= a y; then s . d" reads each row once.
//
//   DP_ASSIGN_OR_RETURN(VectorKernel k, VectorKernel::Create(cmd, 23));
//   std::vector<double> partial(k.num_dots(), 0.0);
//   k.Apply(vectors, rows * width, partial.data());   // per contiguous run
//
// Arithmetic: updates are computed in double and rounded to float once;
// dot products accumulate in double, sequentially in row order, so a run
// over the same rows gives the same bits wherever it executes.
#ifndef DOWNPOUR_HANDLERS_VECTOR_KERNEL_H_
#define DOWNPOUR_HANDLERS_VECTOR_KERNEL_H_

#include <cstddef>

#include "absl/status/statusor.h"
#include "proto/downpour.pb.h"

namespace downpour {

// Most dot products one command may ask for.
inline constexpr int kMaxVectorDots = 16;

class VectorKernel {
 public:
  // kInvalidArgument: a vector index >= num_vectors, a non-finite alpha or
  // beta, unequal dot_x/dot_y lengths, more than kMaxVectorDots dots, an
  // unknown update kind, or open_round without ZERO.
  static absl::StatusOr<VectorKernel> Create(const proto::VectorCommand& cmd,
                                             size_t num_vectors);

  int num_dots() const { return cmd_.dot_x_size(); }
  // Vectors the command reads or writes (the server allocates only these).
  bool Uses(size_t vector) const;

  // Runs the command on `n` contiguous floats: vectors[v] points at vector
  // v's floats for these rows (only those Uses() names are dereferenced).
  // Adds the dot products of this run to partials[0 .. num_dots()).
  void Apply(float* const* vectors, size_t n, double* partials) const;

 private:
  explicit VectorKernel(const proto::VectorCommand& cmd) : cmd_(cmd) {}
  proto::VectorCommand cmd_;
};

}  // namespace downpour

#endif  // DOWNPOUR_HANDLERS_VECTOR_KERNEL_H_
