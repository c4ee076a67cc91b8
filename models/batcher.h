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

#include <algorithm>
#include <cstdint>
#include <random>
#include <vector>

namespace downpour {

class Batcher {
 public:
  // Examples [0, num_examples), shuffled from (seed, stream).
  Batcher(int num_examples, uint64_t seed, int stream)
      : rng_(seed * 1000003 + stream), order_(num_examples) {
    for (int i = 0; i < num_examples; ++i) order_[i] = i;
    std::shuffle(order_.begin(), order_.end(), rng_);
  }

  // The next `batch` indices; a pass that runs out is reshuffled and the
  // batch continues with the next pass. REQUIRES: num_examples > 0.
  std::vector<int> Next(int batch) {
    std::vector<int> out(batch);
    for (int& b : out) {
      if (cursor_ == order_.size()) {
        std::shuffle(order_.begin(), order_.end(), rng_);
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
