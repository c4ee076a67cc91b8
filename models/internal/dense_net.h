// The math of the dense models, templated on the scalar type: model.cc
// serves DenseNet<float> through the Model interface, and the gradient
// tests run DenseNet<double>, the same code, against finite differences in
// double precision. Internal to models/.
//
// A DenseNet is a stack of affine layers with ReLU between them and a
// softmax cross-entropy on top; softmax regression is the stack of one.
// Thread-safe: const methods only, no state beyond the configuration.
#ifndef DOWNPOUR_MODELS_INTERNAL_DENSE_NET_H_
#define DOWNPOUR_MODELS_INTERNAL_DENSE_NET_H_

#include <Eigen/Dense>
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "common/random.h"
#include "models/dataset.h"
#include "models/internal/parallel.h"
#include "models/model.h"

namespace downpour {
namespace models_internal {

template <typename T>
class DenseNet {
 public:
  using Mat = Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
  using RowVec = Eigen::Matrix<T, 1, Eigen::Dynamic>;
  using Vec = Eigen::Matrix<T, Eigen::Dynamic, 1>;

  // `prefix` names the blocks ("softmax" -> "softmax/W"); `numbered` adds
  // the layer index ("mlp/W0"). Zero init gives all-zero parameters,
  // otherwise He-normal weights and zero biases.
  DenseNet(std::string prefix, bool numbered, std::vector<int> sizes, T l2,
           int threads, bool zero_init)
      : sizes_(std::move(sizes)),
        l2_(l2),
        threads_(threads),
        zero_init_(zero_init) {
    DP_CHECK(sizes_.size() >= 2 && sizes_.back() >= 2 && threads_ >= 1)
        << "layers " << sizes_.size() << " threads " << threads_;
    for (int l = 0; l < num_layers(); ++l) {
      DP_CHECK(sizes_[l] >= 1) << "layer " << l << " size " << sizes_[l];
      const std::string suffix = numbered ? absl::StrCat(l) : "";
      w_off_.push_back(num_params_);
      blocks_.push_back({absl::StrCat(prefix, "/W", suffix), size_t(sizes_[l]),
                         size_t(sizes_[l + 1])});
      num_params_ += size_t(sizes_[l]) * sizes_[l + 1];
      b_off_.push_back(num_params_);
      blocks_.push_back(
          {absl::StrCat(prefix, "/b", suffix), 1, size_t(sizes_[l + 1])});
      num_params_ += sizes_[l + 1];
    }
  }

  const std::vector<ParamBlock>& Blocks() const { return blocks_; }
  size_t NumParams() const { return num_params_; }
  int num_layers() const { return static_cast<int>(sizes_.size()) - 1; }

  void Init(uint64_t seed, T* params) const {
    std::mt19937_64 rng(seed);
    for (int l = 0; l < num_layers(); ++l) {
      const size_t w = size_t(sizes_[l]) * sizes_[l + 1];
      const double stddev = std::sqrt(2.0 / sizes_[l]);
      for (size_t i = 0; i < w; ++i) {
        params[w_off_[l] + i] =
            zero_init_ ? T(0) : static_cast<T>(stddev * StandardNormal(rng));
      }
      std::fill(params + b_off_[l], params + b_off_[l] + sizes_[l + 1], T(0));
    }
  }

  // `ready` (may be null): see Model::LossAndGradientStreamed. Ranges are
  // reported as they finish when the batch is one part (one thread), else
  // all at the end.
  double LossAndGradient(
      const T* params, const Dataset& data, const std::vector<int>& batch,
      T* grad,
      const std::function<void(size_t, size_t)>* ready = nullptr) const {
    const int64_t n = static_cast<int64_t>(batch.size());
    DP_CHECK(n > 0) << "empty batch";
    DP_CHECK(data.dim == sizes_[0])
        << "data dim " << data.dim << ", model " << sizes_[0];
    // Forward is 2 flops per parameter and row, backward about 4.
    const int parts = NumParts(threads_, n, 6.0 * num_params_);
    // The L2 terms of the loss, read before any range is reported (after
    // which the caller may overwrite its parameters), added in layer order.
    std::vector<double> l2_loss(num_layers(), 0.0);
    if (l2_ != T(0)) {
      for (int l = 0; l < num_layers(); ++l) {
        l2_loss[l] = 0.5 * static_cast<double>(l2_) *
                     static_cast<double>(W(params, l).squaredNorm());
      }
    }
    const T inv_n = T(1) / static_cast<T>(n);
    // Turns the summed gradient of [off, off + count) into the final one:
    // the mean over the batch, plus the L2 term on weights.
    auto finish = [&](size_t off, size_t count) {
      Eigen::Map<Vec> g(grad + off, count);
      g *= inv_n;
      if (l2_ == T(0)) return;
      for (int l = 0; l < num_layers(); ++l) {
        const size_t w_end = w_off_[l] + size_t(sizes_[l]) * sizes_[l + 1];
        if (off >= w_off_[l] && off < w_end) {
          g += l2_ * Eigen::Map<const Vec>(params + off, count);
        }
      }
    };
    const std::function<void(size_t, size_t)> stream = [&](size_t off,
                                                           size_t count) {
      finish(off, count);
      if (ready != nullptr) (*ready)(off, count);
    };
    std::vector<std::vector<T>> part_grads(parts - 1);
    std::vector<double> part_loss(parts);
    ParallelFor(parts, n, [&](int part, int64_t begin, int64_t end) {
      Mat x(end - begin, data.dim);
      std::vector<int32_t> y(end - begin);
      for (int64_t i = begin; i < end; ++i) {
        const int idx = batch[i];
        DP_CHECK(idx >= 0 && idx < data.num_examples) << "batch index " << idx;
        x.row(i - begin) =
            Eigen::Map<const Eigen::Matrix<float, 1, Eigen::Dynamic>>(
                data.features.data() + size_t(idx) * data.dim, data.dim)
                .template cast<T>();
        y[i - begin] = data.labels[idx];
      }
      T* g = grad;
      if (part > 0) {
        part_grads[part - 1].resize(num_params_);
        g = part_grads[part - 1].data();
      }
      part_loss[part] = SumLossAndGradient(params, x, y.data(), g,
                                           parts == 1 ? &stream : nullptr);
    });
    double loss = part_loss[0];
    if (parts > 1) {
      // Summed in part order, so the result does not depend on scheduling.
      Eigen::Map<Vec> total(grad, num_params_);
      for (int p = 1; p < parts; ++p) {
        total += Eigen::Map<const Vec>(part_grads[p - 1].data(), num_params_);
        loss += part_loss[p];
      }
      size_t off = 0;
      for (const ParamBlock& b : blocks_) {
        stream(off, b.rows * b.width);
        off += b.rows * b.width;
      }
    }
    loss /= static_cast<double>(n);
    for (double t : l2_loss) loss += t;
    return loss;
  }

  std::pair<double, double> Evaluate(const T* params,
                                     const Dataset& data) const {
    if (data.num_examples == 0) return {0.0, 0.0};
    DP_CHECK(data.dim == sizes_[0])
        << "data dim " << data.dim << ", model " << sizes_[0];
    // Chunks bound the memory of the activations and keep each matrix
    // product large enough to run at full speed.
    constexpr int64_t kChunk = 256;
    const int64_t n = data.num_examples;
    const int64_t chunks = (n + kChunk - 1) / kChunk;
    const int parts = static_cast<int>(
        std::min<int64_t>(chunks, NumParts(threads_, n, 2.0 * num_params_)));
    std::vector<int64_t> part_correct(parts, 0);
    std::vector<double> part_loss(parts, 0.0);
    ParallelFor(parts, chunks, [&](int part, int64_t begin, int64_t end) {
      for (int64_t c = begin; c < end; ++c) {
        const int64_t r0 = c * kChunk, rows = std::min(kChunk, n - r0);
        const Eigen::Map<const Eigen::Matrix<float, Eigen::Dynamic,
                                             Eigen::Dynamic, Eigen::RowMajor>>
            x(data.features.data() + size_t(r0) * data.dim, rows, data.dim);
        const Mat z = Logits(params, x.template cast<T>(), nullptr);
        for (int64_t i = 0; i < rows; ++i) {
          const int y = data.labels[r0 + i];
          DP_CHECK(y >= 0 && y < sizes_.back()) << "label " << y;
          Eigen::Index arg;
          const T m = z.row(i).maxCoeff(&arg);
          const T lse = m + std::log((z.row(i).array() - m).exp().sum());
          part_correct[part] += arg == y;
          part_loss[part] += static_cast<double>(lse - z(i, y));
        }
      }
    });
    int64_t correct = 0;
    double loss = 0;
    for (int p = 0; p < parts; ++p) {
      correct += part_correct[p];
      loss += part_loss[p];
    }
    return {static_cast<double>(correct) / n, loss / n};
  }

 private:
  Eigen::Map<const Mat> W(const T* params, int l) const {
    return Eigen::Map<const Mat>(params + w_off_[l], sizes_[l], sizes_[l + 1]);
  }
  Eigen::Map<const RowVec> B(const T* params, int l) const {
    return Eigen::Map<const RowVec>(params + b_off_[l], sizes_[l + 1]);
  }

  // The logits of the rows of x. If `hidden` is not null it receives each
  // hidden layer's output (after the ReLU), for the backward pass.
  template <typename Input>
  Mat Logits(const T* params, const Eigen::MatrixBase<Input>& x,
             std::vector<Mat>* hidden) const {
    Mat prev;
    for (int l = 0;; ++l) {
      Mat z(x.rows(), sizes_[l + 1]);
      if (l == 0) {
        z.noalias() = x.derived() * W(params, 0);
      } else {
        z.noalias() =
            (hidden != nullptr ? hidden->back() : prev) * W(params, l);
      }
      z.rowwise() += B(params, l);
      if (l + 1 == num_layers()) return z;
      z = z.cwiseMax(T(0));
      if (hidden != nullptr) {
        hidden->push_back(std::move(z));
      } else {
        prev = std::move(z);
      }
    }
  }

  // Rows of a weight gradient computed (and reported) together: about
  // 128 KB, so that a caller streaming the gradient gets several ranges of
  // a large layer while the rest is computed.
  static int64_t StreamRows(int width) {
    return std::max<int64_t>(1, (int64_t{32} << 10) / width);
  }

  // Sum over the rows of x (labels y) of the cross-entropy; writes the sum
  // of their gradients (no L2) into grad. If `done` is not null it is
  // called with each range of grad once written, and once the parameters
  // in that range are no longer read.
  double SumLossAndGradient(
      const T* params, const Mat& x, const int32_t* y, T* grad,
      const std::function<void(size_t, size_t)>* done) const {
    std::vector<Mat> hidden;
    // Becomes d(loss)/d(logits) = softmax(z) - onehot(y), row by row.
    Mat delta = Logits(params, x, &hidden);
    double loss = 0;
    for (Eigen::Index i = 0; i < delta.rows(); ++i) {
      DP_CHECK(y[i] >= 0 && y[i] < sizes_.back()) << "label " << y[i];
      auto z = delta.row(i);
      // log-sum-exp shifted by the maximum: no overflow, and no log(0) for
      // a confidently wrong prediction.
      const T m = z.maxCoeff();
      const T lse = m + std::log((z.array() - m).exp().sum());
      loss += static_cast<double>(lse - z(y[i]));
      z = (z.array() - lse).exp().matrix();
      z(y[i]) -= T(1);
    }
    for (int l = num_layers() - 1; l >= 0; --l) {
      const int64_t in = sizes_[l], out = sizes_[l + 1];
      const int64_t rows = StreamRows(sizes_[l + 1]);
      Eigen::Map<Mat> gw(grad + w_off_[l], in, out);
      Eigen::Map<RowVec> gb(grad + b_off_[l], out);
      // Row ranges of the weight gradient, each its own product (the same
      // cut whether or not anyone listens, so the arithmetic never
      // depends on it). The first layer's weights are not read again, so
      // each range is done at once; deeper layers' weights are read below
      // to propagate delta.
      for (int64_t r = 0; r < in; r += rows) {
        const int64_t k = std::min(rows, in - r);
        if (l == 0) {
          gw.middleRows(r, k).noalias() =
              x.middleCols(r, k).transpose() * delta;
          if (done != nullptr) (*done)(w_off_[l] + r * out, k * out);
        } else {
          gw.middleRows(r, k).noalias() =
              hidden[l - 1].middleCols(r, k).transpose() * delta;
        }
      }
      gb = delta.colwise().sum();
      if (l > 0) {
        Mat back;
        back.noalias() = delta * W(params, l).transpose();
        // ReLU passes the gradient where its output was positive.
        back.array() *= (hidden[l - 1].array() > T(0)).template cast<T>();
        delta.swap(back);
        if (done != nullptr) (*done)(w_off_[l], size_t(in * out));
      }
      if (done != nullptr) (*done)(b_off_[l], size_t(out));
    }
    return loss;
  }

  const std::vector<int> sizes_;
  const T l2_;
  const int threads_;
  const bool zero_init_;
  std::vector<ParamBlock> blocks_;
  std::vector<size_t> w_off_, b_off_;
  size_t num_params_ = 0;
};

}  // namespace models_internal
}  // namespace downpour

#endif  // DOWNPOUR_MODELS_INTERNAL_DENSE_NET_H_
