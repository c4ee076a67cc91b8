// Training data: Fashion-MNIST from its gzip IDX files, read by our own
// parser. No networking here.
#ifndef DOWNPOUR_MODELS_DATASET_H_
#define DOWNPOUR_MODELS_DATASET_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace downpour {

struct Dataset {
  int num_examples = 0;
  int dim = 0;
  int num_classes = 0;
  std::vector<float> features;  // row-major num_examples x dim, in [0, 1]
  std::vector<int32_t> labels;  // in [0, num_classes)
};

// Reads {train,t10k}-{images-idx3,labels-idx1}-ubyte.gz from `dir`.
// kNotFound for a missing file, kDataLoss for a corrupt or truncated one.
absl::StatusOr<Dataset> LoadFashionMnist(const std::string& dir, bool train);

// Worker `rank` of `num_shards` takes examples rank, rank + num_shards, ...
// (strided, so every shard sees every class in the same proportions).
Dataset Shard(const Dataset& data, int rank, int num_shards);

}  // namespace downpour

#endif  // DOWNPOUR_MODELS_DATASET_H_
