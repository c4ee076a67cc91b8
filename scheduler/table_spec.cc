#include "scheduler/table_spec.h"

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "handlers/handler.h"
#include "handlers/initializer.h"

namespace downpour {
namespace {

absl::Status BadSpec(const proto::TableSpec& spec, absl::string_view why) {
  return absl::InvalidArgumentError(
      absl::StrCat("table '", spec.name(), "': ", why));
}

}  // namespace

absl::Status ValidateTableShape(const proto::TableSpec& spec) {
  if (spec.name().empty()) return BadSpec(spec, "empty name");
  if (spec.kind() != proto::DENSE && spec.kind() != proto::SPARSE) {
    return BadSpec(spec, "kind must be DENSE or SPARSE");
  }
  if (spec.width() < 1 || spec.width() > kMaxTableWidth) {
    return BadSpec(spec,
                   absl::StrCat("width ", spec.width(), " not in [1, 2^20]"));
  }
  if (spec.kind() == proto::DENSE && spec.num_keys() == 0) {
    return BadSpec(spec, "a dense table needs num_keys >= 1");
  }
  if (spec.kind() == proto::SPARSE && spec.num_keys() != 0) {
    return BadSpec(
        spec, "a sparse table spans the whole key space; leave num_keys 0");
  }
  if (spec.vectors_size() > 0) {
    // Named vectors exist for server-side algebra over contiguous ranges.
    if (spec.kind() != proto::DENSE) {
      return BadSpec(spec, "named vectors need a dense table");
    }
    if (spec.vectors_size() > kMaxTableVectors) {
      return BadSpec(
          spec, absl::StrCat(spec.vectors_size(), " named vectors, at most ",
                             kMaxTableVectors));
    }
    absl::flat_hash_set<std::string> names;
    for (const std::string& v : spec.vectors()) {
      if (v.empty()) return BadSpec(spec, "a named vector without a name");
      if (!names.insert(v).second) {
        return BadSpec(spec, absl::StrCat("vector '", v, "' named twice"));
      }
    }
  }
  // The servers' own check, so that the scheduler never publishes a table
  // whose initializer every server would refuse (an unknown kind, a NaN
  // value: found by table_spec_fuzzer).
  if (auto init = Initializer::Create(spec.init()); !init.ok()) {
    return BadSpec(spec, init.status().message());
  }
  return absl::OkStatus();
}

absl::Status ValidateTableSpec(const proto::TableSpec& spec,
                               const std::vector<std::string>& plugin_names) {
  DP_RETURN_IF_ERROR(ValidateTableShape(spec));
  // The one call site of the handler check (//handlers).
  DP_RETURN_IF_ERROR(ValidateHandlerSpec(spec.handler(), plugin_names),
                     "table '", spec.name(), "'");
  return absl::OkStatus();
}

}  // namespace downpour
