#include "common/usage.h"

#include <string>

#include "absl/flags/usage.h"
#include "absl/flags/usage_config.h"
#include "absl/strings/match.h"

namespace downpour {
namespace {

// Abseil's own flags are defined under absl/flags/; ours anywhere else.
bool IsOurs(absl::string_view file) {
  return !absl::StrContains(file, "absl/");
}

// Bazel compiles with paths relative to the workspace, sometimes with an
// execroot prefix for generated code: show them from the package on.
std::string Normalize(absl::string_view file) {
  const size_t pos = file.find("/execroot/");
  if (pos != absl::string_view::npos) {
    absl::string_view rest = file.substr(pos + 10);
    const size_t slash = rest.find('/');  // the workspace name
    if (slash != absl::string_view::npos)
      return std::string(rest.substr(slash + 1));
  }
  if (absl::StartsWith(file, "./")) return std::string(file.substr(2));
  return std::string(file);
}

}  // namespace

void SetUsage(absl::string_view usage_message) {
  absl::SetProgramUsageMessage(usage_message);
  absl::FlagsUsageConfig config;
  config.contains_helpshort_flags = IsOurs;
  config.contains_help_flags = IsOurs;
  config.normalize_filename = Normalize;
  absl::SetFlagsUsageConfig(config);
}

}  // namespace downpour
