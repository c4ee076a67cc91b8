#include "common/token_file.h"

#include <fstream>
#include <sstream>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"

namespace downpour {

absl::StatusOr<std::string> ReadTokenFile(const std::string& path) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot read ", path));
  std::stringstream ss;
  ss << in.rdbuf();
  const std::string token(absl::StripAsciiWhitespace(ss.str()));
  if (token.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(path, " is empty"));
  }
  if (token.size() > 512) {
    return absl::InvalidArgumentError(absl::StrCat(
        path, ": a token of ", token.size(), " bytes, at most 512"));
  }
  for (char c : token) {
    if (c < 0x21 || c > 0x7e) {
      return absl::InvalidArgumentError(absl::StrCat(
          path, ": the token may hold printable ASCII only, without spaces"));
    }
  }
  return token;
}

}  // namespace downpour
