#include "common/error_reason.h"

#include <cstring>

#include "absl/strings/cord.h"

namespace downpour {
namespace {
constexpr char kPayloadUrl[] = "type.downpour.dev/downpour.ErrorReason";
}  // namespace

absl::Status WithReason(absl::Status status, ErrorReason reason) {
  if (status.ok() || reason == ErrorReason::kUnspecified) return status;
  const uint32_t v = static_cast<uint32_t>(reason);
  char bytes[sizeof v];
  std::memcpy(bytes, &v, sizeof v);
  status.SetPayload(kPayloadUrl,
                    absl::Cord(absl::string_view(bytes, sizeof v)));
  return status;
}

ErrorReason ReasonOf(const absl::Status& status) {
  absl::optional<absl::Cord> payload = status.GetPayload(kPayloadUrl);
  if (!payload.has_value() || payload->size() != sizeof(uint32_t)) {
    return ErrorReason::kUnspecified;
  }
  const std::string bytes(*payload);
  uint32_t v = 0;
  std::memcpy(&v, bytes.data(), sizeof v);
  return ReasonFromWire(v);
}

ErrorReason ReasonFromWire(uint32_t value) {
  return value <= static_cast<uint32_t>(ErrorReason::kDrainUnderWay)
             ? static_cast<ErrorReason>(value)
             : ErrorReason::kUnspecified;
}

}  // namespace downpour
