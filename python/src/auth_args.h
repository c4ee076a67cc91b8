// The TLS arguments Client.connect and JobMember.join share, as the SDK's
// TlsFiles (common/auth.h). None means "not given"; any file given turns
// TLS on, and ClusterAuth::Load then insists on a complete set.
#ifndef DOWNPOUR_PYTHON_SRC_AUTH_ARGS_H_
#define DOWNPOUR_PYTHON_SRC_AUTH_ARGS_H_

#include <optional>
#include <string>

#include "common/auth.h"

namespace downpour {
namespace python {

inline TlsFiles TlsFilesOf(const std::optional<std::string>& ca_file,
                           const std::optional<std::string>& cert_file,
                           const std::optional<std::string>& key_file,
                           bool mutual,
                           const std::optional<std::string>& server_name) {
  TlsFiles tls;
  tls.ca_file = ca_file.value_or("");
  tls.cert_file = cert_file.value_or("");
  tls.key_file = key_file.value_or("");
  tls.mutual = mutual;
  tls.server_name = server_name.value_or("");
  return tls;
}

}  // namespace python
}  // namespace downpour

#endif  // DOWNPOUR_PYTHON_SRC_AUTH_ARGS_H_
