// The key batches of ps_bench's sparse section, shared with the benchmarks
// that time its parts alone (embedding_bench --sections=lookups), so that
// both draw the same ids.
//
//   std::vector<Key> all = HashedIds(1000000);
//   auto batches = DrawBatches("zipf", all, 100000, 8);
#ifndef DOWNPOUR_BENCH_SPARSE_DRAWS_H_
#define DOWNPOUR_BENCH_SPARSE_DRAWS_H_

#include <cstddef>
#include <string>
#include <vector>

#include "common/types.h"

namespace downpour {
namespace bench {

// `count` distinct keys spread over the sparse key space (id i times the
// golden ratio's 64-bit constant, modulo the key space): every server of a
// table gets its share, and sequential ids share no low bits.
std::vector<Key> HashedIds(size_t count);

// `count` batches of `batch` keys drawn from `all` with repeats: uniformly
// ("uniform"), or by a Zipf law of exponent 1.1 over the ranks of `all`
// ("zipf": all[0] the most frequent). Seeded: the same batches every run.
std::vector<std::vector<Key>> DrawBatches(const std::string& dist,
                                          const std::vector<Key>& all,
                                          size_t batch, int count);

}  // namespace bench
}  // namespace downpour

#endif  // DOWNPOUR_BENCH_SPARSE_DRAWS_H_
