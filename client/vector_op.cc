#include "client/vector_op.h"

#include "absl/strings/str_cat.h"
#include "client/internal/vector_request.h"

namespace downpour {

absl::StatusOr<std::vector<double>> VectorOp(
    Client& client, const Table& t, const proto::VectorCommand& command) {
  VectorRequest request(command);
  // Wait has its own bound; the operation's deadline (op_timeout) ends it
  // first.
  absl::Status s = client.Wait(VectorOps::Submit(client, t, &request),
                               absl::InfiniteDuration());
  if (!s.ok()) return s;
  std::vector<double> sums(command.dot_x_size(), 0.0);
  absl::MutexLock lock(&request.mu);
  for (const auto& [first_key, partial] : request.partials) {
    if (partial.size() != sums.size()) {
      return absl::DataLossError(
          absl::StrCat("vector command on table '", t.name,
                       "': the range from key ", first_key, " returned ",
                       partial.size(), " scalars, expected ", sums.size()));
    }
    for (size_t j = 0; j < sums.size(); ++j) sums[j] += partial[j];
  }
  return sums;
}

}  // namespace downpour
