// The release version of this build, from the repository's VERSION file
// (the one place it is written; Bazel compiles it in):
//
//   std::printf("psctl %s\n", downpour::kVersion);   // "0.1.0"
//
// The same string is downpour.__version__ in Python, the image tag of
// deploy/Containerfile builds and the tag the kustomize overlays name.
#ifndef DOWNPOUR_COMMON_VERSION_H_
#define DOWNPOUR_COMMON_VERSION_H_

namespace downpour {

extern const char kVersion[];

}  // namespace downpour

#endif  // DOWNPOUR_COMMON_VERSION_H_
