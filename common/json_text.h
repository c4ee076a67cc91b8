// JSON text shared by the structured log lines (common/logging.cc), the
// planner's JSON documents (planner/json.cc) and psctl's reading of
// protobuf's JSON (psctl/output.cc).
#ifndef DOWNPOUR_COMMON_JSON_TEXT_H_
#define DOWNPOUR_COMMON_JSON_TEXT_H_

#include <cstdint>
#include <string>

#include "absl/strings/string_view.h"

namespace downpour {

// Appends `s` as a JSON string literal: quotes, backslashes and control
// characters escaped; bytes >= 0x80 pass through (UTF-8 in, UTF-8 out).
void AppendJsonString(absl::string_view s, std::string* out);

// Appends the UTF-8 bytes of `code`, a \uXXXX escape's code unit (below
// 0x10000; surrogate pairs are not combined: names and messages do not
// need them).
void AppendUtf8(uint32_t code, std::string* out);

}  // namespace downpour

#endif  // DOWNPOUR_COMMON_JSON_TEXT_H_
