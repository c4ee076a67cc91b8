// The one place where grpc::Status and absl::Status meet. Both use the same
// canonical code numbers.
#ifndef DOWNPOUR_COMMON_GRPC_STATUS_H_
#define DOWNPOUR_COMMON_GRPC_STATUS_H_

#include <string>

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "common/error_reason.h"
#include "grpcpp/grpcpp.h"

namespace downpour {

inline constexpr char kGrpcReasonPrefix[] = "downpour-reason:";

// The reason (common/error_reason.h) travels in the status's details as
// "downpour-reason:<n>"; other details (from gRPC itself) are ignored.
inline absl::Status FromGrpcStatus(const grpc::Status& s,
                                   absl::string_view context = "") {
  if (s.ok()) return absl::OkStatus();
  std::string msg = context.empty()
                        ? s.error_message()
                        : absl::StrCat(context, ": ", s.error_message());
  absl::Status out(static_cast<absl::StatusCode>(s.error_code()), msg);
  uint32_t reason = 0;
  const std::string all_details = s.error_details();  // a copy
  absl::string_view details = all_details;
  if (absl::ConsumePrefix(&details, kGrpcReasonPrefix) &&
      absl::SimpleAtoi(details, &reason)) {
    out = WithReason(std::move(out), ReasonFromWire(reason));
  }
  return out;
}

inline grpc::Status ToGrpcStatus(const absl::Status& s) {
  if (s.ok()) return grpc::Status::OK;
  const ErrorReason reason = ReasonOf(s);
  if (reason == ErrorReason::kUnspecified) {
    return grpc::Status(static_cast<grpc::StatusCode>(s.code()),
                        std::string(s.message()));
  }
  return grpc::Status(
      static_cast<grpc::StatusCode>(s.code()), std::string(s.message()),
      absl::StrCat(kGrpcReasonPrefix, static_cast<uint32_t>(reason)));
}

}  // namespace downpour

#endif  // DOWNPOUR_COMMON_GRPC_STATUS_H_
