// Reading a trained model back from the servers, and comparing parameters
// bit for bit: what the training, checkpoint and failure tests check.
#ifndef DOWNPOUR_TESTS_MODEL_PARAMS_H_
#define DOWNPOUR_TESTS_MODEL_PARAMS_H_

#include <cstddef>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "client/client.h"
#include "models/model.h"

namespace downpour {

// The dense tables a worker declares for `model` (named "<prefix>/<block>",
// e.g. "mlp/W0"), read whole and concatenated in the model's block order.
absl::StatusOr<std::vector<float>> ReadModelParams(Client& client,
                                                   const Model& model,
                                                   const std::string& prefix);

// How many floats differ bit for bit, counting a length difference as that
// many differing floats.
size_t CountDiffering(const std::vector<float>& a, const std::vector<float>& b);

}  // namespace downpour

#endif  // DOWNPOUR_TESTS_MODEL_PARAMS_H_
