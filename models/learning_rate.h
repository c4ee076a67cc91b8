// The workers' learning-rate schedule under BSP. The servers average the N
// workers' gradients of a step, so the global batch is N x batch and the
// rate follows the linear scaling rule, N x lr, reached by a linear
// warm-up (Goyal et al. 2017); the workers scale their gradients by it and
// the servers' SGD runs with rate 1. SSP and ASP need no schedule here:
// their servers run Adagrad.
#ifndef DOWNPOUR_MODELS_LEARNING_RATE_H_
#define DOWNPOUR_MODELS_LEARNING_RATE_H_

#include <algorithm>
#include <cstdint>

namespace downpour {

// The rate at step `clock` (0-based): lr x (1 + (N - 1) x ramp), with ramp
// growing linearly from 1 / warmup_steps to 1 over the first warmup_steps
// steps. A pure function; warmup_steps < 1 counts as 1.
inline float BspLearningRate(double lr, int num_workers, int warmup_steps,
                             int64_t clock) {
  const double ramp =
      std::min(1.0, static_cast<double>(clock + 1) / std::max(1, warmup_steps));
  return static_cast<float>(lr * (1.0 + (num_workers - 1) * ramp));
}

}  // namespace downpour

#endif  // DOWNPOUR_MODELS_LEARNING_RATE_H_
