#include "common/host_memory.h"

#include <algorithm>
#include <fstream>
#include <optional>
#include <sstream>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace downpour {
namespace {

std::optional<std::string> ReadFile(const std::string& path) {
  std::ifstream in(path);
  if (!in) return std::nullopt;
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// A number in a cgroup file; nullopt for "max", a missing file or junk.
std::optional<uint64_t> ReadNumber(const std::string& path) {
  std::optional<std::string> text = ReadFile(path);
  if (!text) return std::nullopt;
  uint64_t v;
  if (!absl::SimpleAtoi(absl::StripAsciiWhitespace(*text), &v)) {
    return std::nullopt;
  }
  return v;
}

// Bytes the memory cgroup of this process has left, if it has a limit.
std::optional<uint64_t> CgroupRoom(const MemorySources& src) {
  std::optional<std::string> self = ReadFile(src.self_cgroup);
  if (!self) return std::nullopt;
  // (limit file, usage file), most specific first; the hierarchy's root
  // stands for a container whose cgroup namespace hides the path.
  std::vector<std::pair<std::string, std::string>> candidates;
  for (absl::string_view line : absl::StrSplit(*self, '\n')) {
    std::vector<std::string> f = absl::StrSplit(line, absl::MaxSplits(':', 2));
    if (f.size() != 3) continue;
    if (f[0] == "0" && f[1].empty()) {  // cgroup v2
      for (const std::string& dir :
           {absl::StrCat(src.cgroup_root, f[2]), src.cgroup_root}) {
        candidates.emplace_back(dir + "/memory.max", dir + "/memory.current");
      }
    }
    for (absl::string_view c : absl::StrSplit(f[1], ',')) {
      if (c != "memory") continue;  // cgroup v1
      const std::string base = src.cgroup_root + "/memory";
      for (const std::string& dir : {absl::StrCat(base, f[2]), base}) {
        candidates.emplace_back(dir + "/memory.limit_in_bytes",
                                dir + "/memory.usage_in_bytes");
      }
    }
  }
  for (const auto& [limit_file, usage_file] : candidates) {
    std::optional<uint64_t> limit = ReadNumber(limit_file);
    // v1 writes "no limit" as a page-rounded INT64_MAX.
    if (!limit || *limit >= (uint64_t{1} << 60)) continue;
    const uint64_t usage = ReadNumber(usage_file).value_or(0);
    return usage >= *limit ? 0 : *limit - usage;
  }
  return std::nullopt;
}

}  // namespace

absl::StatusOr<uint64_t> AvailableMemoryBytes(const MemorySources& src) {
  std::optional<std::string> meminfo = ReadFile(src.meminfo);
  if (!meminfo) {
    return absl::NotFoundError(absl::StrCat("cannot read ", src.meminfo));
  }
  std::optional<uint64_t> available;
  for (absl::string_view line : absl::StrSplit(*meminfo, '\n')) {
    if (!absl::ConsumePrefix(&line, "MemAvailable:")) continue;
    line = absl::StripAsciiWhitespace(line);
    uint64_t kb;
    if (absl::ConsumeSuffix(&line, "kB") &&
        absl::SimpleAtoi(absl::StripAsciiWhitespace(line), &kb)) {
      available = kb * 1024;
    }
  }
  if (!available) {
    return absl::InvalidArgumentError(
        absl::StrCat(src.meminfo, " has no MemAvailable line in kB"));
  }
  if (std::optional<uint64_t> room = CgroupRoom(src)) {
    return std::min(*available, *room);
  }
  return *available;
}

}  // namespace downpour
