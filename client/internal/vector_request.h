// A vector command in flight through the client (client/vector_op.h runs
// it; client.cc routes it like any range operation). Not part of the SDK.
#ifndef DOWNPOUR_CLIENT_INTERNAL_VECTOR_REQUEST_H_
#define DOWNPOUR_CLIENT_INTERNAL_VECTOR_REQUEST_H_

#include <map>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "common/types.h"
#include "proto/downpour.pb.h"

namespace downpour {

// Thread-safe: parts answer on the client's I/O thread.
struct VectorRequest {
  explicit VectorRequest(const proto::VectorCommand& c) : command(c) {}

  const proto::VectorCommand command;
  bool writes() const { return command.update() != proto::VectorCommand::NONE; }

  absl::Mutex mu;
  // Each answered part's partial dot products, by the first key of the
  // part: summed in key order, so that the result is the same wherever the
  // ranges live.
  std::map<Key, std::vector<double>> partials ABSL_GUARDED_BY(mu);
};

}  // namespace downpour

#endif  // DOWNPOUR_CLIENT_INTERNAL_VECTOR_REQUEST_H_
