// The one place where grpc::Status and absl::Status meet. Both use the same
// canonical code numbers.
#ifndef DOWNPOUR_COMMON_GRPC_STATUS_H_
#define DOWNPOUR_COMMON_GRPC_STATUS_H_

#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "grpcpp/grpcpp.h"

namespace downpour {

inline absl::Status FromGrpcStatus(const grpc::Status& s,
                                   absl::string_view context = "") {
  if (s.ok()) return absl::OkStatus();
  std::string msg = context.empty()
                        ? s.error_message()
                        : absl::StrCat(context, ": ", s.error_message());
  return absl::Status(static_cast<absl::StatusCode>(s.error_code()), msg);
}

inline grpc::Status ToGrpcStatus(const absl::Status& s) {
  if (s.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(s.code()),
                      std::string(s.message()));
}

}  // namespace downpour

#endif  // DOWNPOUR_COMMON_GRPC_STATUS_H_
