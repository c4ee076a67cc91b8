// Synthetic click logs shaped like Criteo Kaggle, with a planted model whose
// accuracy is the best any model can reach on them:
//
//   GeneratorOptions o;
//   o.seed = 7;
//   o.scale = 0.01;                 // tables at 1% of Criteo's sizes
//   ASSIGN_OR_RETURN(auto gen, ClickLogGenerator::Create(o));
//   ClickLogStream train(gen.get(), /*rank=*/r, /*num_shards=*/n);
//   train.Next(batch_view);         // this rank's next rows
//   gen->Fill(kHeldOutFirstRow, 1, eval_view);  // held-out rows
//
// Rows. Row i (any 64-bit index) is a pure function of (options, i): its
// words come from a SplitMix64 stream seeded by (seed, i), so rows can be
// made in any order, by any number of processes, and never all at once.
// Training streams shard by row index (row i belongs to rank i mod N);
// held-out rows start at kHeldOutFirstRow, far beyond any training row.
//
// Fields. 26 categorical fields with Criteo Kaggle's cardinalities times
// `scale` (rounded; a field never shrinks below min(its size, 16), so that
// the small fields keep their few values). Field f's id is a rank drawn
// from a Zipf law over [0, cardinality_f) with exponent zipf_exponent (id 0
// the most frequent; ZipfSampler). 13 dense fields: integer counts drawn
// from exponential laws with Criteo-like means (kDenseMeans), floored,
// reported as log(1 + count).
//
// Labels: P(click) = sigmoid(bias + sum_f w_f(id_f) + sum_j v_j * std_j),
// where w_f(id) = id_weight_stddev * n(seed, f, id) is a hidden weight per
// id, a pure function of (seed, field, id) (n: a hash made roughly standard
// normal, the sum of four uniform 16-bit parts, scaled), so nothing of
// size cardinality is ever stored; v_j = dense_weight_stddev * n(seed, j);
// std_j is dense field j standardized by its exact mean and deviation.
// The label is 1 with that probability.
//
// The best achievable accuracy is the planted model's own: Planted()
// computes its AUC and log loss on the held-out rows with the label noise
// integrated out (auc.h: ExpectedAuc, ExpectedLogLoss), a figure that
// converges to the population value with the number of rows and does not
// depend on the labels drawn.
//
// Speed: about 1-2 million rows per second per core (clicklog_gen prints
// it). Memory: the Zipf tables, at most 2^12 entries of 8 bytes per field.
// ClickLogGenerator is immutable after Create; thread-safe.
#ifndef DOWNPOUR_CLICKLOG_GENERATOR_H_
#define DOWNPOUR_CLICKLOG_GENERATOR_H_

#include <array>
#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "clicklog/click_batch.h"
#include "clicklog/zipf.h"

namespace downpour {
namespace clicklog {

// The first held-out row: training streams never reach it.
inline constexpr uint64_t kHeldOutFirstRow = uint64_t{1} << 40;

// Means of the dense fields' exponential counts (Criteo-like magnitudes).
inline constexpr std::array<double, kNumDense> kDenseMeans = {
    3, 100, 20, 8, 3000, 100, 15, 12, 100, 1, 3, 2, 10};

struct GeneratorOptions {
  uint64_t seed = 1;
  double scale = 1.0;  // of Criteo's cardinalities, in (0, 1000]
  double zipf_exponent = 1.1;
  // The planted model (see the file comment). The defaults give a click
  // rate near Criteo's 26% and a best achievable AUC of 0.80-0.83 (seed 1:
  // 0.806 at scale 0.01; a seed draws the few values of the small fields,
  // which move it most).
  double id_weight_stddev = 0.25;
  double dense_weight_stddev = 0.25;
  double bias = -1.5;
};

struct PlantedStats {
  double auc = 0;       // ExpectedAuc of the planted probabilities
  double log_loss = 0;  // ExpectedLogLoss (their mean entropy, nats)
  double click_rate = 0;
};

class ClickLogGenerator {
 public:
  // kInvalidArgument for a scale outside (0, 1000], a negative or
  // non-finite exponent or standard deviation, a non-finite bias.
  static absl::StatusOr<std::unique_ptr<ClickLogGenerator>> Create(
      const GeneratorOptions& options);

  const GeneratorOptions& options() const { return options_; }
  // Ids per categorical field after scaling.
  const std::array<uint64_t, kNumCategorical>& cardinalities() const {
    return cardinalities_;
  }

  // Rows first_row, first_row + stride, ... (out.rows of them) into out.
  // REQUIRES: stride >= 1; out's spans at least as long as out.rows needs
  // (optional ones empty or long enough).
  void Fill(uint64_t first_row, uint64_t stride,
            const ClickBatchView& out) const;

  // The planted model's hidden weights and its probability for one row's
  // features (dense as Fill reports them).
  float IdWeight(int field, uint64_t id) const;
  float DenseWeight(int field) const { return dense_weight_[field]; }
  double Probability(const float* dense, const int64_t* categorical) const;

  // The planted model on `rows` held-out rows (from kHeldOutFirstRow).
  PlantedStats Planted(size_t rows) const;

 private:
  ClickLogGenerator(const GeneratorOptions& options,
                    const std::array<uint64_t, kNumCategorical>& cards);

  // Levels of each dense field's quantized distribution: a draw takes one
  // of kDenseLevels equally likely counts.
  static constexpr int kDenseLevelBits = 12;
  static constexpr int kDenseLevels = 1 << kDenseLevelBits;

  double Logit(const float* dense, const int64_t* categorical) const;

  GeneratorOptions options_;
  std::array<uint64_t, kNumCategorical> cardinalities_;
  std::vector<ZipfSampler> zipf_;
  std::array<uint64_t, kNumCategorical> field_salt_;
  uint64_t row_salt_;
  std::array<std::vector<int64_t>, kNumDense> dense_count_;
  std::array<std::vector<float>, kNumDense> dense_value_;
  std::array<double, kNumDense> dense_mean_, dense_inv_std_;
  std::array<float, kNumDense> dense_weight_;
};

// One rank's share of the training rows, in order: rows rank, rank + N,
// rank + 2N, ... from the start'th of them. Thread-compatible.
class ClickLogStream {
 public:
  // `generator` must outlive the stream. REQUIRES: 0 <= rank < num_shards.
  ClickLogStream(const ClickLogGenerator* generator, int rank, int num_shards,
                 uint64_t start = 0);
  // The next out.rows rows of the shard.
  void Next(const ClickBatchView& out);
  // Rows of this shard handed out so far (including `start`).
  uint64_t position() const { return position_; }

 private:
  const ClickLogGenerator* generator_;
  uint64_t rank_, num_shards_, position_;
};

}  // namespace clicklog
}  // namespace downpour

#endif  // DOWNPOUR_CLICKLOG_GENERATOR_H_
