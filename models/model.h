// Models the workers train: their parameters live in parameter-server
// tables as flat float arrays, and the model computes loss and gradient on
// a mini-batch with Eigen. No networking here.
#ifndef DOWNPOUR_MODELS_MODEL_H_
#define DOWNPOUR_MODELS_MODEL_H_

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "models/dataset.h"

namespace downpour {

// One dense table: `rows` keys of `width` floats.
struct ParamBlock {
  std::string name;
  size_t rows;
  size_t width;
};

// Thread-safe: the methods are const and keep no state.
class Model {
 public:
  virtual ~Model() = default;
  // The parameter tables, in order; a parameter vector is their
  // concatenation.
  virtual std::vector<ParamBlock> Blocks() const = 0;
  virtual size_t NumParams() const = 0;
  // Deterministic initial values from `seed`.
  virtual void Init(uint64_t seed, float* params) const = 0;
  // Mean loss over the batch; writes (does not accumulate) its gradient.
  virtual double LossAndGradient(const float* params, const Dataset& data,
                                 const std::vector<int>& batch,
                                 float* grad) const = 0;
  // (accuracy in [0, 1], mean loss) over all of `data`.
  virtual std::pair<double, double> Evaluate(const float* params,
                                             const Dataset& data) const = 0;
};

// Multinomial logistic regression; W is dim x classes, b 1 x classes; zero
// init. `l2` adds l2/2 ||W||^2 (biases not regularized).
std::unique_ptr<Model> MakeSoftmaxRegression(int dim, int classes,
                                             float l2 = 0);
// ReLU hidden layers and a softmax output, e.g. {784, 256, 10}; He-normal
// init of the weights, zero biases.
std::unique_ptr<Model> MakeMlp(std::vector<int> layer_sizes, float l2 = 0);

}  // namespace downpour

#endif  // DOWNPOUR_MODELS_MODEL_H_
