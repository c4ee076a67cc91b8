// The mini-batches a worker draws from its shard: a reshuffled pass over
// the shard's examples, from a seed and the worker's rank. Shared with the
// tests that replay a distributed run in one process.
// Not thread-safe.
#ifndef DOWNPOUR_WORKER_BATCHER_H_
#define DOWNPOUR_WORKER_BATCHER_H_

#include <algorithm>
#include <cstdint>
#include <random>
#include <vector>

namespace downpour {

class Batcher {
 public:
  Batcher(int num_examples, uint64_t seed, int rank)
      : rng_(seed * 1000003 + rank), order_(num_examples) {
    for (int i = 0; i < num_examples; ++i) order_[i] = i;
    std::shuffle(order_.begin(), order_.end(), rng_);
  }

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

// The BSP learning rate at `clock`: linear scaling from lr to N x lr over
// `warmup_steps` (see worker.h); then, if decay_from < 1, constant until
// clock decay_from x steps and falling linearly to 0 at clock `steps`,
// which removes most of SGD's noise from the last iterate.
inline float BspLearningRate(double lr, int num_workers, int warmup_steps,
                             int64_t clock, int64_t steps = 0,
                             double decay_from = 1.0) {
  const double ramp = std::min(
      1.0, static_cast<double>(clock + 1) / std::max(1, warmup_steps));
  double rate = lr * (1.0 + (num_workers - 1) * ramp);
  const double start = decay_from * static_cast<double>(steps);
  if (steps > 0 && decay_from < 1.0 && clock >= start) {
    rate *= 1.0 - (static_cast<double>(clock) - start) /
                      (static_cast<double>(steps) - start);
  }
  return static_cast<float>(rate);
}

}  // namespace downpour

#endif  // DOWNPOUR_WORKER_BATCHER_H_
