// Summing the rows of a write batch's repeated keys before it is sent, for
// a table declared with sum_repeats (TableOptions::sum_repeats): each
// distinct key is then applied once, with the sum of its rows, as a
// minibatch's gradient is in TorchRec and FBGEMM.
//
//   Buffer keys, values;
//   absl::StatusOr<size_t> d = SumRepeats(batch, grads, width, pool, &keys,
//                                         &values);
//   // *d < batch.size(): send keys[0, d) with values[0, d * width) instead.
//
// Thread-compatible: uses the calling thread's FirstSeen table.
#ifndef DOWNPOUR_CLIENT_INTERNAL_SUM_REPEATS_H_
#define DOWNPOUR_CLIENT_INTERNAL_SUM_REPEATS_H_

#include <cstddef>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "common/buffer_pool.h"
#include "common/types.h"

namespace downpour {

// The distinct keys of `keys` in the order of their first occurrence, into
// *keys_out, and for each the sum of its rows of `width` floats from
// `values` (row i belongs to keys[i]), into *values_out: the first
// occurrence's row, then each repeat's added in batch order, so that the
// sums are the same bit for bit from run to run. Returns how many distinct
// keys there are; when that is keys.size() (no repeats) nothing is
// written. Every repeat is found, whatever the batch's size (large batches
// by sorting). kInvalidArgument for 2^32 keys or more.
// REQUIRES: values holds keys.size() * width floats.
absl::StatusOr<size_t> SumRepeats(absl::Span<const Key> keys,
                                  const float* values, size_t width,
                                  BufferPool& pool, Buffer* keys_out,
                                  Buffer* values_out);

}  // namespace downpour

#endif  // DOWNPOUR_CLIENT_INTERNAL_SUM_REPEATS_H_
