// Address files: how a daemon started on a free port (--listen=...:0) tells
// whoever started it where it listens. The daemon writes one line at once
// (never half a line); the starter waits for it.
#ifndef DOWNPOUR_COMMON_ADDRESS_FILE_H_
#define DOWNPOUR_COMMON_ADDRESS_FILE_H_

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/subprocess.h"

namespace downpour {

// Writes "<address>\n" to a temporary file and renames it onto `path`.
// kInternal naming the path if that fails.
absl::Status WriteAddressFile(const std::string& path,
                              const std::string& address);

// Waits until `path` holds a complete line and returns it without trailing
// white space. kDeadlineExceeded after `timeout`; kInternal with its log
// tail if `writer` (may be null) exits first.
absl::StatusOr<std::string> WaitForAddressFile(const std::string& path,
                                               absl::Duration timeout,
                                               Subprocess* writer = nullptr);

}  // namespace downpour

#endif  // DOWNPOUR_COMMON_ADDRESS_FILE_H_
