// How much memory this process could still take on the machine it runs
// on: what a daemon's main() reads once at start to size its defaults
// (ps_server's table memory limit). Libraries never call it; they take a
// number in their options.
//
//   DP_ASSIGN_OR_RETURN(uint64_t available, AvailableMemoryBytes());
//
// Thread-safe (reads files only).
#ifndef DOWNPOUR_COMMON_HOST_MEMORY_H_
#define DOWNPOUR_COMMON_HOST_MEMORY_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"

namespace downpour {

// Where the figures come from (tests point them at files of their own).
struct MemorySources {
  std::string meminfo = "/proc/meminfo";
  std::string self_cgroup = "/proc/self/cgroup";
  std::string cgroup_root = "/sys/fs/cgroup";
};

// The smaller of the machine's MemAvailable and, when this process's
// memory cgroup (v2 memory.max, or v1 memory.limit_in_bytes) sets a limit,
// that limit minus the cgroup's usage: in a Kubernetes pod, the pod's
// limit rather than the node's memory. kNotFound if /proc/meminfo cannot
// be read, kInvalidArgument if it has no MemAvailable line. An unreadable
// cgroup is ignored.
absl::StatusOr<uint64_t> AvailableMemoryBytes(
    const MemorySources& sources = {});

}  // namespace downpour

#endif  // DOWNPOUR_COMMON_HOST_MEMORY_H_
