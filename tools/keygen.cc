// ps_keygen: writes a new cluster secret for --cluster_secret_file.
//
//   bazel-bin/tools/ps_keygen --out=/etc/downpour/cluster.secret
//
// The file is created with mode 0600 and refused if it exists, so that a
// running cluster's secret is never overwritten by accident. Give the same
// file to every node (in Kubernetes, as a Secret; see deploy/k8s/).
#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <string>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "common/auth.h"
#include "common/usage.h"

ABSL_FLAG(std::string, out, "", "file to create (mode 0600); '-' for stdout");

int main(int argc, char** argv) {
  downpour::SetUsage(
      "writes a new Downpour cluster secret (usage: ps_keygen --out=FILE)");
  absl::ParseCommandLine(argc, argv);
  const std::string out = absl::GetFlag(FLAGS_out);
  if (out.empty()) {
    std::fprintf(stderr, "ps_keygen: --out is required\n");
    return 2;
  }
  auto secret = downpour::ClusterAuth::NewSecret();
  if (!secret.ok()) {
    std::fprintf(stderr, "ps_keygen: %s\n", secret.status().ToString().c_str());
    return 1;
  }
  const std::string line = *secret + "\n";
  if (out == "-") {
    std::fputs(line.c_str(), stdout);
    return 0;
  }
  const int fd = ::open(out.c_str(), O_WRONLY | O_CREAT | O_EXCL, 0600);
  if (fd < 0) {
    std::fprintf(stderr, "ps_keygen: cannot create %s: %s\n", out.c_str(),
                 std::strerror(errno));
    return 1;
  }
  const bool ok = ::write(fd, line.data(), line.size()) ==
                  static_cast<ssize_t>(line.size());
  ::close(fd);
  if (!ok) {
    std::fprintf(stderr, "ps_keygen: cannot write %s\n", out.c_str());
    return 1;
  }
  return 0;
}
