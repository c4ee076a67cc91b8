// Why an operation failed, as a type: set by the code that knows, read by
// the code that decides what to do (retry, wait, give up). Nobody searches
// an error's message to decide anything.
//
//   return WithReason(absl::FailedPreconditionError("restore 7 is under way"),
//                     ErrorReason::kRestoreUnderWay);
//   ...
//   if (ReasonOf(s) == ErrorReason::kRestoreUnderWay) { wait and retry }
//
// The reason travels as an absl::Status payload in a process (Annotate in
// common/status_macros.h keeps it), over gRPC in the status's details
// (common/grpc_status.h converts both ways) and on the data plane in
// DataHeader.error_reason. Thread-safe (pure functions).
#ifndef DOWNPOUR_COMMON_ERROR_REASON_H_
#define DOWNPOUR_COMMON_ERROR_REASON_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace downpour {

// Stable numbers: they cross the wire. Add, never renumber.
enum class ErrorReason : uint32_t {
  kUnspecified = 0,
  // The scheduler is restoring a checkpoint; a second restore must wait
  // for it (FAILED_PRECONDITION).
  kRestoreUnderWay = 1,
  // The map names no live server for the keys: their holder is dead or
  // unknown and no backup took over (UNAVAILABLE). Retrying on the same
  // map cannot help; a new map may.
  kNoLiveHolder = 2,
  // A server does not serve the range as primary in its map (ABORTED):
  // route again on a newer map.
  kNotOwner = 3,
  // A server has not applied the request's map yet (UNAVAILABLE): retry
  // after a short wait.
  kServerBehind = 4,
  // A range refuses writes while its primary hands it over (UNAVAILABLE):
  // retry after a short wait.
  kHandingOver = 5,
  // The connection to the server broke or it left the map (UNAVAILABLE):
  // route again on a newer map.
  kConnectionLost = 6,
  // Another server is being drained; one drain runs at a time
  // (FAILED_PRECONDITION): retry once it is done.
  kDrainUnderWay = 7,
};

// `status` with `reason` attached (OK stays OK).
absl::Status WithReason(absl::Status status, ErrorReason reason);
// The reason attached to `status`; kUnspecified if none.
ErrorReason ReasonOf(const absl::Status& status);

// A data-plane or gRPC reason number as an ErrorReason; unknown numbers (a
// newer peer) read as kUnspecified.
ErrorReason ReasonFromWire(uint32_t value);

}  // namespace downpour

#endif  // DOWNPOUR_COMMON_ERROR_REASON_H_
