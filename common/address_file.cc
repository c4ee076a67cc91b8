#include "common/address_file.h"

#include <cstdio>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"

namespace downpour {

absl::Status WriteAddressFile(const std::string& path,
                              const std::string& address) {
  const std::string tmp = path + ".tmp";
  std::ofstream out(tmp);
  out << address << "\n";
  out.close();
  if (!out || std::rename(tmp.c_str(), path.c_str()) != 0) {
    return absl::InternalError(
        absl::StrCat("cannot write the address to ", path));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> WaitForAddressFile(const std::string& path,
                                               absl::Duration timeout,
                                               Subprocess* writer) {
  const absl::Time deadline = absl::Now() + timeout;
  while (absl::Now() < deadline) {
    std::ifstream in(path);
    if (in) {
      std::stringstream ss;
      ss << in.rdbuf();
      const std::string content = ss.str();
      if (!content.empty() && content.back() == '\n') {
        return std::string(absl::StripTrailingAsciiWhitespace(content));
      }
    }
    if (writer != nullptr && writer->Wait(absl::ZeroDuration()).ok()) {
      return absl::InternalError(absl::StrCat("process exited before writing ",
                                              path, "; log:\n",
                                              writer->LogTail()));
    }
    absl::SleepFor(absl::Milliseconds(20));
  }
  return absl::DeadlineExceededError(absl::StrCat(
      "file ", path, " did not appear within ", absl::FormatDuration(timeout)));
}

}  // namespace downpour
