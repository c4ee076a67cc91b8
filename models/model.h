// The models the workers train. Their parameters live in parameter-server
// tables as flat float arrays; a worker pulls them, calls the model for the
// loss and gradient of a mini-batch, and pushes the gradient. No networking
// here, and no copies of the parameters: the math runs on Eigen maps over
// the caller's arrays.
//
//   std::unique_ptr<Model> m = MakeMlp({784, 256, 10});
//   std::vector<float> params(m->NumParams()), grad(m->NumParams());
//   m->Init(seed, params.data());
//   double loss = m->LossAndGradient(params.data(), data, batch, grad.data());
//
// Dense models (softmax regression, MLP) implement Model. Sparse logistic
// regression over SparseDataset is a pair of free functions at the end: the
// worker asks for the batch's feature ids, pulls only their weights, and
// pushes gradients for exactly those ids.
#ifndef DOWNPOUR_MODELS_MODEL_H_
#define DOWNPOUR_MODELS_MODEL_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/types/span.h"
#include "models/dataset.h"

namespace downpour {

// One dense parameter table: `rows` keys of `width` floats, row-major, so
// key k holds floats [k * width, (k + 1) * width) of the block.
struct ParamBlock {
  std::string name;
  size_t rows;
  size_t width;
};

// A dense model over Dataset. Thread-safe: the methods are const and keep
// no state, so one instance may serve several threads at once.
class Model {
 public:
  virtual ~Model() = default;
  // The parameter tables, in order; a parameter array is their
  // concatenation, NumParams() floats in all.
  virtual std::vector<ParamBlock> Blocks() const = 0;
  virtual size_t NumParams() const = 0;
  // Writes NumParams() initial values, a deterministic function of `seed`.
  virtual void Init(uint64_t seed, float* params) const = 0;
  // Mean loss over the examples data[batch[0]], data[batch[1]], ... (indices
  // may repeat) plus the L2 term, and writes (not accumulates) its gradient
  // into `grad` (NumParams() floats, same layout as params). Blocks until
  // done; may run on up to the model's `threads` threads (see the
  // factories). REQUIRES (checked, aborts): batch non-empty, every index in
  // [0, data.num_examples), data.dim equal to the model's input size, the
  // labels used in [0, classes).
  virtual double LossAndGradient(const float* params, const Dataset& data,
                                 const std::vector<int>& batch,
                                 float* grad) const = 0;
  // Receives a range [offset, offset + count) of the gradient, in the
  // parameter layout, once it is final.
  using GradientReady = std::function<void(size_t offset, size_t count)>;
  // LossAndGradient that reports each range of `grad` as soon as it is
  // final, on the calling thread, so that the caller can send it while the
  // rest is computed (layer-wise pipelining: the last layer first, a large
  // weight matrix in row ranges). After ready(o, c) the call neither writes
  // grad nor reads params in [o, o + c), so the caller may overwrite those
  // params (with the reply of a PushPull, say). The ranges cover
  // NumParams() exactly once, each inside one block and made of whole rows;
  // how they are cut may depend on threads and batch size, so do not key
  // anything shared on them. Gradient and loss are bit-for-bit those of
  // LossAndGradient. The default reports everything at the end.
  virtual double LossAndGradientStreamed(const float* params,
                                         const Dataset& data,
                                         const std::vector<int>& batch,
                                         float* grad,
                                         const GradientReady& ready) const {
    const double loss = LossAndGradient(params, data, batch, grad);
    ready(0, NumParams());
    return loss;
  }
  // (accuracy in [0, 1], mean cross-entropy without the L2 term) over all
  // of `data`; (0, 0) for an empty one. Same threading; same REQUIRES on
  // dim and labels.
  virtual std::pair<double, double> Evaluate(const float* params,
                                             const Dataset& data) const = 0;
};

// Threads: LossAndGradient splits the batch (Evaluate: the data) into up to
// `threads` contiguous parts, one per std::thread started for the call (the
// calling thread takes the first), and sums the parts' gradients in order.
// Parts are kept large enough (about 2 MFLOP each) that starting a thread
// pays off, so small batches of small models stay on the calling thread.
// Results are deterministic for a given `threads` and batch; different
// `threads` values agree up to float rounding. Eigen itself runs
// single-threaded (we do not build with OpenMP).

// Multinomial logistic regression: blocks {"softmax/W", dim rows, classes
// wide}, {"softmax/b", 1 row, classes wide}; Init writes zeros. The loss is
// mean cross-entropy + l2 / 2 * ||W||^2 (biases are not regularized).
// REQUIRES: dim >= 1, classes >= 2, threads >= 1.
std::unique_ptr<Model> MakeSoftmaxRegression(int dim, int classes, float l2 = 0,
                                             int threads = 1);

// A multilayer perceptron: `layer_sizes` = {input, hidden..., classes}, e.g.
// {784, 256, 10}, with ReLU after each hidden layer and a softmax output.
// Blocks per layer l = 0, 1, ...: {"mlp/W<l>", in rows, out wide} and
// {"mlp/b<l>", 1 row, out wide}. Init draws weights from He's normal
// N(0, 2 / in) and zeroes the biases. Loss: mean cross-entropy + l2 / 2 *
// sum of ||W||^2. REQUIRES: at least two sizes, all >= 1, the last >= 2,
// threads >= 1.
std::unique_ptr<Model> MakeMlp(std::vector<int> layer_sizes, float l2 = 0,
                               int threads = 1);

// Sparse logistic regression: P(label 1 | row) = sigmoid(sum_j w[id_j] *
// value_j), one weight per feature id (a parameter-server table of width 1
// keyed by feature id) and no separate bias (give every row a constant
// feature for one). A step for rows [begin, end):
//
//   std::vector<uint64_t> ids = BatchFeatureIds(data, begin, end);
//   std::vector<float> w(ids.size()), g(ids.size());
//   ... pull the weights of `ids` into w ...
//   double loss = SparseLogRegLossAndGradient(data, begin, end, ids, w,
//                                             absl::MakeSpan(g));
//   ... push (ids, g) ...

// The distinct feature ids of rows [begin, end), sorted ascending.
// REQUIRES: begin <= end <= data.NumRows().
std::vector<uint64_t> BatchFeatureIds(const SparseDataset& data, size_t begin,
                                      size_t end);

// Mean log-loss of rows [begin, end) plus l2 / 2 * sum of weights[i]^2, with
// weights[i] the weight of ids[i]. Writes grad[i], the derivative with
// respect to the weight of ids[i]; an id no row uses gets only the L2 part.
// Returns 0 (and the L2 parts) for an empty range. Single-threaded.
// REQUIRES: ids sorted, distinct and containing every feature id of the
// rows (BatchFeatureIds gives exactly those); weights and grad as long as
// ids; begin <= end <= data.NumRows().
double SparseLogRegLossAndGradient(const SparseDataset& data, size_t begin,
                                   size_t end, absl::Span<const uint64_t> ids,
                                   absl::Span<const float> weights,
                                   absl::Span<float> grad, float l2 = 0);

}  // namespace downpour

#endif  // DOWNPOUR_MODELS_MODEL_H_
