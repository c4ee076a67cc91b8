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

// A bounded sparse table's SparseBounds: each field in its range, and a
// combination that bounds something.
absl::Status ValidateBounds(const proto::TableSpec& spec) {
  const proto::SparseBounds& b = spec.bounds();
  auto bad = [&](absl::string_view field, absl::string_view why) {
    return BadSpec(spec, absl::StrCat("bounds.", field, ": ", why));
  };
  if (spec.kind() != proto::SPARSE) {
    return BadSpec(spec,
                   "bounds (a row cap, eviction, expiry, admission, a cold "
                   "tier) are for sparse tables; a dense table's rows are "
                   "all allocated at declaration");
  }
  if (b.max_rows() < 0) {
    return bad("max_rows", absl::StrCat(b.max_rows(), " is negative"));
  }
  if (b.max_bytes() < 0) {
    return bad("max_bytes", absl::StrCat(b.max_bytes(), " is negative"));
  }
  if (b.max_rows() > 0 && b.max_bytes() > 0) {
    return bad("max_rows", "give max_rows or max_bytes, not both");
  }
  if (b.max_rows() > kMaxTableRows) {
    return bad("max_rows", absl::StrCat(b.max_rows(), " is beyond ",
                                        kMaxTableRows, " rows"));
  }
  if (!proto::SparseBounds::Eviction_IsValid(b.eviction())) {
    return bad("eviction", absl::StrCat("unknown policy ", b.eviction(),
                                        " (EVICTION_NONE, LRU, LFU)"));
  }
  if (b.ttl_clocks() < 0 || b.ttl_clocks() > kMaxTtl) {
    return bad("ttl_clocks",
               absl::StrCat(b.ttl_clocks(), " not in [0, ", kMaxTtl, "]"));
  }
  if (b.ttl_seconds() < 0 || b.ttl_seconds() > kMaxTtl) {
    return bad("ttl_seconds",
               absl::StrCat(b.ttl_seconds(), " not in [0, ", kMaxTtl, "]"));
  }
  if (b.ttl_clocks() > 0 && b.ttl_seconds() > 0) {
    return bad("ttl_clocks", "give one TTL, in clocks or in seconds");
  }
  if (b.admit_after() < 1 || b.admit_after() > kMaxAdmitAfter) {
    return bad("admit_after",
               absl::StrCat(b.admit_after(), " not in [1, ", kMaxAdmitAfter,
                            "] (1: every id gets a row at its first push)"));
  }
  if (b.max_pending_ids() < 0 || b.max_pending_ids() > kMaxTableRows) {
    return bad(
        "max_pending_ids",
        absl::StrCat(b.max_pending_ids(), " not in [0, ", kMaxTableRows, "]"));
  }
  const bool capped = b.max_rows() > 0 || b.max_bytes() > 0;
  if (!capped &&
      (b.eviction() != proto::SparseBounds::EVICTION_NONE || b.cold_tier())) {
    return bad(b.cold_tier() ? "cold_tier" : "eviction",
               "needs a row cap (max_rows or max_bytes) to make room under");
  }
  if (!capped && b.ttl_clocks() == 0 && b.ttl_seconds() == 0 &&
      b.admit_after() == 1) {
    return bad("max_rows",
               "a cap of 0 rows holds nothing: give max_rows or max_bytes "
               "(or a TTL, or admit_after > 1)");
  }
  return absl::OkStatus();
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
  if (spec.has_bounds()) DP_RETURN_IF_ERROR(ValidateBounds(spec));
  if (spec.consistency() != proto::CONSISTENCY_UNSPECIFIED) {
    if (!proto::Consistency_IsValid(spec.consistency())) {
      return BadSpec(spec,
                     absl::StrCat("unknown consistency ", spec.consistency(),
                                  " (BSP, SSP or ASP)"));
    }
    if (!spec.follows_job()) {
      return BadSpec(spec,
                     "a table's own consistency policy needs follows_job: "
                     "the scheduler enforces it over the job's workers");
    }
  }
  if (spec.consistency() == proto::SSP
          ? spec.staleness() < 0 || spec.staleness() > kMaxTtl
          : spec.staleness() != 0) {
    return BadSpec(spec, absl::StrCat("staleness ", spec.staleness(),
                                      ": an SSP table's bound, in [0, ",
                                      kMaxTtl, "]; 0 for other policies"));
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
