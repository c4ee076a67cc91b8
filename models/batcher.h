// The mini-batches a worker draws from its shard of the training examples:
// reshuffled passes over the shard, from a seed and the worker's rank (or
// any other stream number), so that a distributed run and its
// single-process replay draw the same batches.
//
//   Batcher batcher(shard.num_examples, seed, rank);
//   std::vector<int> batch = batcher.Next(64);  // indices into the shard
//
// Not thread-safe: one Batcher per thread.
#ifndef DOWNPOUR_MODELS_BATCHER_H_
#define DOWNPOUR_MODELS_BATCHER_H_

#include <cstdint>
#include <random>
#include <vector>

#include "absl/types/span.h"
#include "common/random.h"

namespace downpour {

class Batcher {
 public:
  // Examples [0, num_examples), shuffled from (seed, stream) with the
  // portable shuffle (common/random.h): the same batches everywhere.
  Batcher(int num_examples, uint64_t seed, int stream)
      : rng_(StreamSeed(seed, static_cast<uint64_t>(stream))),
        order_(num_examples) {
    for (int i = 0; i < num_examples; ++i) order_[i] = i;
    Shuffle(absl::MakeSpan(order_), rng_);
  }

  // The next `batch` indices; a pass that runs out is reshuffled and the
  // batch continues with the next pass. REQUIRES: num_examples > 0.
  std::vector<int> Next(int batch) {
    std::vector<int> out(batch);
    for (int& b : out) {
      if (cursor_ == order_.size()) {
        Shuffle(absl::MakeSpan(order_), rng_);
        cursor_ = 0;
      }
      b = order_[cursor_++];
    }
    return out;
  }

 private:
  std::mt19937_64 rng_;
  std::vector<int> order_;
  size_t cursor_ = 0;
};

}  // namespace downpour

#endif  // DOWNPOUR_MODELS_BATCHER_H_
