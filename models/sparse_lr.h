// Sparse logistic regression beyond the loss (model.h): what a worker needs
// to train it from a parameter-server table and to evaluate it.
//  - SparseFeatureKey: the table key of a feature id;
//  - SparseTrainRows / SelectRows: a worker's disjoint, shuffled share of
//    the training rows;
//  - EvaluateSparseLogReg: held-out log-loss, accuracy and AUC;
//  - LoadLibsvmFile: a libsvm file with errors that name it.
// No networking here. Pure functions of their arguments (LoadLibsvmFile
// reads its file); thread-safe.
#ifndef DOWNPOUR_MODELS_SPARSE_LR_H_
#define DOWNPOUR_MODELS_SPARSE_LR_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "models/dataset.h"

namespace downpour {

// The table key of a feature id. Ids are spread over the key space by a
// bijective 64-bit mix (SplitMix64's finalizer; the servers split the key
// space into contiguous ranges, so raw small ids would all land on one
// server). The key space is [0, 2^64 - 1), so the one id that mixes to
// 2^64 - 1 shares key 0.
uint64_t SparseFeatureKey(uint64_t feature_id);

// The rows worker `rank` of `workers` trains on, out of the first
// `train_rows` rows, in the order it visits them: row i belongs to rank
// i mod workers, and each rank shuffles its share (Fisher-Yates with a
// generator seeded by seed and rank). A pure function: the shards are
// disjoint, together cover [0, train_rows), and are the same on every run
// and machine. REQUIRES: 0 <= rank < workers.
std::vector<size_t> SparseTrainRows(size_t train_rows, int rank, int workers,
                                    uint64_t seed);

// The rows `rows` of `data`, in that order. REQUIRES: every row index is
// below data.NumRows().
SparseDataset SelectRows(const SparseDataset& data,
                         const std::vector<size_t>& rows);

// Held-out metrics of `weights` (weights[i] for ids[i], ids sorted as
// BatchFeatureIds gives them; an id not among them has weight 0) over all
// of `data`.
struct SparseEval {
  double log_loss = 0;
  double accuracy = 0;  // p > 0.5 against the label
  double auc = 0;       // area under the ROC curve; 0.5 if one class only
};
SparseEval EvaluateSparseLogReg(const SparseDataset& data,
                                const std::vector<uint64_t>& ids,
                                const std::vector<float>& weights);

// Reads and parses a libsvm file (ParseLibsvm). kNotFound if it cannot be
// opened; the parser's errors (kInvalidArgument naming the line and token,
// kDataLoss) with the path added.
absl::StatusOr<SparseDataset> LoadLibsvmFile(const std::string& path);

}  // namespace downpour

#endif  // DOWNPOUR_MODELS_SPARSE_LR_H_
