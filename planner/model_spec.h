// What the planner knows of a model: a description read from a small JSON
// file, and what follows from it (parameter tables as a worker declares
// them, GEMM shapes, bytes moved per step).
//
//   {
//     "name": "mlp",
//     "batch": 64,                       // examples per worker and step
//     "dense_layers": [784, 256, 10],    // sizes: input, hidden..., output
//     "handler": {"bsp": "momentum", "ssp": "adagrad", "asp": "adagrad"},
//     "embeddings": [                    // optional, for embedding models
//       {"name": "ads", "rows": 10000000, "width": 16,
//        "ids_per_example": 20, "unique_fraction": 0.6}
//     ]
//   }
//
// "handler" is the servers' update rule, one name for every mode or one per
// mode (sgd, momentum, adagrad, adam, ftrl, sum, assign); "dense_layers" is
// a fully connected network as ps_worker's MLP builds it (weights W<l> of
// in x out and biases b<l>, ReLU between layers), and may be left out for a
// pure embedding model. An embedding table is pulled and pushed for the
// distinct ids of each batch: batch x ids_per_example x unique_fraction
// rows of `width` floats.
//
// ReadModelSpec's errors name the file and the field: kNotFound (no such
// file), kInvalidArgument (not JSON, a missing, misspelt or out-of-range
// field: "model file 'm.json': field 'dense_layers[1]' (line 4): must be an
// integer >= 1, is 0").
#ifndef DOWNPOUR_PLANNER_MODEL_SPEC_H_
#define DOWNPOUR_PLANNER_MODEL_SPEC_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "planner/json.h"

namespace downpour {
namespace planner {

enum class Mode { kBsp = 0, kSsp = 1, kAsp = 2 };
inline constexpr Mode kAllModes[] = {Mode::kBsp, Mode::kSsp, Mode::kAsp};
const char* ModeName(Mode m);  // "bsp", "ssp", "asp"

struct EmbeddingTable {
  std::string name;
  int64_t rows = 0;  // distinct ids in the table
  int64_t width = 0;
  double ids_per_example = 0;
  double unique_fraction = 1;  // distinct ids in a batch / ids in a batch
};

// One parameter table of the dense part, as ps_worker declares it: `rows`
// keys of `width` floats.
struct DenseBlock {
  std::string name;
  int64_t rows = 0;
  int64_t width = 0;
  int64_t floats() const { return rows * width; }
};

struct ModelSpec {
  std::string name;
  int64_t batch = 0;
  std::vector<int64_t> layer_sizes;  // empty: no dense part
  std::vector<EmbeddingTable> embeddings;
  std::string handler[3];  // per Mode

  int num_layers() const {
    return layer_sizes.empty() ? 0 : static_cast<int>(layer_sizes.size()) - 1;
  }
  // W0, b0, W1, b1, ... (the order of ps_worker's tables).
  std::vector<DenseBlock> DenseBlocks() const;
  int64_t DenseFloats() const;
  // Distinct ids of table `e` in one batch (at least 1 when ids are used).
  double DistinctIds(const EmbeddingTable& e) const;
  const std::string& HandlerFor(Mode m) const {
    return handler[static_cast<int>(m)];
  }
};

// Reads and checks the model file at `path`.
absl::StatusOr<ModelSpec> ReadModelSpec(const std::string& path);
// The same from text; `where` names the source in errors ("model file
// 'm.json'").
absl::StatusOr<ModelSpec> ParseModelSpec(absl::string_view text,
                                         const std::string& where);
// The file's JSON form (what ParseModelSpec reads back).
Json ModelSpecToJson(const ModelSpec& spec);

// Reads a whole file: kNotFound naming `what` and the path when it does not
// exist, kPermissionDenied / kInternal for other failures.
absl::StatusOr<std::string> ReadTextFile(const std::string& path,
                                         absl::string_view what);

}  // namespace planner
}  // namespace downpour

#endif  // DOWNPOUR_PLANNER_MODEL_SPEC_H_
