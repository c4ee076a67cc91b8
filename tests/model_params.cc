#include "tests/model_params.h"

#include <cstring>

#include "common/status_macros.h"

namespace downpour {

absl::StatusOr<std::vector<float>> ReadModelParams(Client& client,
                                                   const Model& model,
                                                   const std::string& prefix) {
  std::vector<float> params;
  for (const ParamBlock& b : model.Blocks()) {
    DP_ASSIGN_OR_RETURN(Table t, client.OpenTable(prefix + "/" + b.name));
    std::vector<float> v(b.rows * b.width);
    DP_RETURN_IF_ERROR(
        client.GetSync(t, Keys::Range(0, b.rows), absl::MakeSpan(v)));
    params.insert(params.end(), v.begin(), v.end());
  }
  return params;
}

size_t CountDiffering(const std::vector<float>& a,
                      const std::vector<float>& b) {
  size_t differ = 0;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) {
    differ += std::memcmp(&a[i], &b[i], sizeof(float)) != 0;
  }
  return differ +
         (a.size() > b.size() ? a.size() - b.size() : b.size() - a.size());
}

}  // namespace downpour
