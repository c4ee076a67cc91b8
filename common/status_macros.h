// Early-return helpers for absl::Status and absl::StatusOr (Debian's Abseil
// 20220623 ships none).
//
//   DP_RETURN_IF_ERROR(DoThing());
//   DP_ASSIGN_OR_RETURN(auto value, ComputeValue());
//   DP_RETURN_IF_ERROR(DoThing(), "while loading table ", name);  // adds
//   context
#ifndef DOWNPOUR_COMMON_STATUS_MACROS_H_
#define DOWNPOUR_COMMON_STATUS_MACROS_H_

#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"

namespace downpour {

// Returns `status` with `context` prepended to its message; the code and
// the payloads (e.g. a typed ErrorReason, common/error_reason.h) are kept.
inline absl::Status Annotate(const absl::Status& status,
                             absl::string_view context) {
  if (status.ok() || context.empty()) return status;
  absl::Status out(status.code(),
                   absl::StrCat(context, ": ", status.message()));
  status.ForEachPayload(
      [&out](absl::string_view url, const absl::Cord& payload) {
        out.SetPayload(url, payload);
      });
  return out;
}

}  // namespace downpour

#define DP_STATUS_CONCAT_INNER_(a, b) a##b
#define DP_STATUS_CONCAT_(a, b) DP_STATUS_CONCAT_INNER_(a, b)

#define DP_RETURN_IF_ERROR(expr, ...)                                       \
  do {                                                                      \
    ::absl::Status dp_status_ = (expr);                                     \
    if (!dp_status_.ok()) {                                                 \
      return ::downpour::Annotate(dp_status_, ::absl::StrCat(__VA_ARGS__)); \
    }                                                                       \
  } while (false)

#define DP_ASSIGN_OR_RETURN(lhs, expr, ...)                                 \
  DP_ASSIGN_OR_RETURN_IMPL_(DP_STATUS_CONCAT_(dp_statusor_, __LINE__), lhs, \
                            expr, __VA_ARGS__)

#define DP_ASSIGN_OR_RETURN_IMPL_(tmp, lhs, expr, ...)                      \
  auto tmp = (expr);                                                        \
  if (!tmp.ok()) {                                                          \
    return ::downpour::Annotate(tmp.status(), ::absl::StrCat(__VA_ARGS__)); \
  }                                                                         \
  lhs = std::move(tmp).value()

#endif  // DOWNPOUR_COMMON_STATUS_MACROS_H_
