// How every psctl command prints what it found, in the format `-o` picks,
// the way kubectl does: human tables (the default), `wide` tables with
// more columns, or the same data as JSON or YAML for scripts.
//
//   // main() parses -o once and hands the format to the command:
//   absl::StatusOr<OutputFormat> f = ParseOutputFormat("json");
//   ...
//   psctl::VersionInfo v;                         // a message of psctl.proto
//   v.set_version(kVersion);
//   return PrintOutput(v, *f, [&](bool wide) {    // the human form
//     return absl::StrCat("psctl ", v.version(), "\n");
//   });
//
// One JSON style for every command: protobuf's JSON mapping of the
// message, with the .proto's snake_case field names and every field
// present, zero values included (so `jq .field` never meets a missing
// key); 64-bit integers are strings, as that mapping has them. YAML is the
// same tree. A command's machine-readable output is therefore always a
// message: add one to psctl/psctl.proto for a new command's result.
//
// Thread-compatible (no state); PrintOutput writes to stdout.
#ifndef DOWNPOUR_PSCTL_OUTPUT_H_
#define DOWNPOUR_PSCTL_OUTPUT_H_

#include <functional>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "google/protobuf/message.h"

namespace downpour {

// psctl's exit statuses, for every command.
inline constexpr int kExitOk = 0;
inline constexpr int kExitFailed = 1;  // the operation failed
inline constexpr int kExitUsage = 2;   // bad usage

enum class OutputFormat {
  kText,  // aligned tables (the default)
  kWide,  // the tables with more columns
  kJson,
  kYaml,
};

// "" or "text", "wide", "json", "yaml"; kInvalidArgument naming the
// choices otherwise.
absl::StatusOr<OutputFormat> ParseOutputFormat(absl::string_view name);

// `message` in the one JSON style above, ending in a newline.
std::string ToJson(const google::protobuf::Message& message);
// `message` as a YAML document with the same keys and values as ToJson
// (block style; strings quoted where YAML would read them otherwise).
std::string ToYaml(const google::protobuf::Message& message);
// A JSON text (as ToJson prints) as YAML; kInvalidArgument if it is not
// JSON. For callers that hold JSON already.
absl::StatusOr<std::string> JsonToYaml(absl::string_view json);

// Prints `message` to stdout in `format`; for kText and kWide, prints
// what `text(wide)` returns instead. Returns kExitOk, or kExitFailed
// (with a message on stderr) if the message cannot be printed.
int PrintOutput(const google::protobuf::Message& message, OutputFormat format,
                const std::function<std::string(bool wide)>& text);

}  // namespace downpour

#endif  // DOWNPOUR_PSCTL_OUTPUT_H_
