// Reading a token shared through a file (e.g. a Kubernetes Secret mounted
// into the pod): the job token that lets workers take a rank. main() reads
// it; libraries take the string in their options.
//
//   DP_ASSIGN_OR_RETURN(std::string token, ReadTokenFile(path));
#ifndef DOWNPOUR_COMMON_TOKEN_FILE_H_
#define DOWNPOUR_COMMON_TOKEN_FILE_H_

#include <string>

#include "absl/status/statusor.h"

namespace downpour {

// The file's content without surrounding white space. kNotFound if it
// cannot be read; kInvalidArgument if it is empty, longer than 512 bytes,
// or has characters outside printable ASCII. The message names the path,
// never the token.
absl::StatusOr<std::string> ReadTokenFile(const std::string& path);

}  // namespace downpour

#endif  // DOWNPOUR_COMMON_TOKEN_FILE_H_
