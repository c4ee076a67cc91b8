// Training data for the workers, held in memory:
//  - Dataset: dense features with class labels, loaded from Fashion-MNIST's
//    gzip IDX files by our own parser, and split between workers by Shard.
//  - SparseDataset: rows of (feature id, value) pairs with 0/1 labels, for
//    sparse logistic regression; parsed from libsvm text or generated as
//    synthetic click data with power-law feature ids.
// No networking here. Everything is a plain value: copy it, share it
// read-only between threads.
//
//   DP_ASSIGN_OR_RETURN(Dataset train, LoadFashionMnist(dir, /*train=*/true));
//   Dataset mine = Shard(train, rank, num_workers);
#ifndef DOWNPOUR_MODELS_DATASET_H_
#define DOWNPOUR_MODELS_DATASET_H_

#include <cstddef>
#include <cstdint>
#include <istream>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace downpour {

struct Dataset {
  int num_examples = 0;
  int dim = 0;
  int num_classes = 0;
  std::vector<float> features;  // row-major num_examples x dim, in [0, 1]
  std::vector<int32_t> labels;  // num_examples entries in [0, num_classes)
};

// Reads {train,t10k}-images-idx3-ubyte.gz and the matching
// -labels-idx1-ubyte.gz from `dir` (train selects which pair). Pixels are
// scaled by 1/255 into [0, 1]; num_classes is 10.
// Errors: kNotFound if a file is missing or unreadable; kDataLoss if a file
// is not valid gzip, is truncated, has a wrong magic number or size, the two
// files disagree on the example count, or a label is outside [0, 10).
absl::StatusOr<Dataset> LoadFashionMnist(const std::string& dir, bool train);

// The parsing half of LoadFashionMnist: `images` and `labels` are the
// decompressed IDX3 and IDX1 contents, named `images_name` and `labels_name`
// in errors. kDataLoss as above (a wrong magic number or size, counts that
// disagree, a label outside [0, 10)), before allocating more than the
// contents describe.
absl::StatusOr<Dataset> ParseIdx(absl::string_view images,
                                 absl::string_view labels,
                                 absl::string_view images_name,
                                 absl::string_view labels_name);

// The examples of worker `rank` out of `num_shards`: rank, rank + num_shards,
// rank + 2 * num_shards, ... (strided rather than contiguous, so that every
// shard gets the classes in about the same proportions even if the file were
// sorted by class). Shard sizes differ by at most one.
// REQUIRES: 0 <= rank < num_shards.
Dataset Shard(const Dataset& data, int rank, int num_shards);

// Rows of sparse features in compressed-row form: row r has the features
// feature_ids[i] with values feature_values[i] for i in
// [row_offsets[r], row_offsets[r + 1]). row_offsets has NumRows() + 1
// entries and starts at 0; ids within a row are distinct.
struct SparseDataset {
  std::vector<uint64_t> feature_ids;
  std::vector<float> feature_values;
  std::vector<size_t> row_offsets = {0};
  std::vector<float> labels;  // 0 or 1, one per row

  size_t NumRows() const { return labels.size(); }
};

// Parses libsvm/svmlight text: one row per line, "label id:value id:value
// ...", separated by spaces or tabs. The label is 1 or +1 (positive), 0 or
// -1 (negative); ids are unsigned 64-bit integers, kept as written (no
// 1-based shift) and must be distinct within a line; values are finite
// floats. Blank lines and text after '#' are ignored.
// Errors: kInvalidArgument naming the 1-based line number and the bad token;
// kDataLoss if the stream fails while reading.
absl::StatusOr<SparseDataset> ParseLibsvm(std::istream& in);

// Synthetic click-through data that logistic regression can learn.
// Each row holds `features_per_row` distinct ids with value 1, drawn from a
// Zipf distribution over [0, num_features) (P(id) proportional to
// 1 / (id + 1)^zipf_exponent, so id 0 is the most frequent; exponent 0 is
// uniform) with repeats redrawn; a row is shorter only if 10x as many draws
// do not find enough distinct ids (num_features < features_per_row, or an
// extreme exponent). Ids within a row are sorted. As in real click logs an
// id appears at most once per row, so the hottest ids saturate at one per
// row and the power law shows in the rest.
// Labels: a hidden weight per id, a fixed function of (seed, id) drawn from
// N(0, 2.5^2 / features_per_row), gives the row's logit z = sum of its
// weights, and the label is 1 with probability sigmoid(z).
// Deterministic in all arguments.
// REQUIRES: features_per_row >= 1, num_features >= 1, zipf_exponent >= 0.
SparseDataset GenerateClickData(size_t rows, size_t features_per_row,
                                uint64_t num_features, double zipf_exponent,
                                uint64_t seed);

}  // namespace downpour

#endif  // DOWNPOUR_MODELS_DATASET_H_
