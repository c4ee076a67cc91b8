// The scheduler's checks of a table declaration (proto::TableSpec), apart
// from the scheduler so that they can be unit-tested and fuzzed
// (scheduler/table_spec_fuzzer.cc). Pure functions; thread-safe.
//
//   DP_RETURN_IF_ERROR(ValidateTableShape(spec));         // at once
//   ... wait for servers, learn their plugins ...
//   DP_RETURN_IF_ERROR(ValidateTableSpec(spec, plugins));  // before publishing
//
// Errors name the table: "table 'emb': width 0 not in [1, 2^20]".
#ifndef DOWNPOUR_SCHEDULER_TABLE_SPEC_H_
#define DOWNPOUR_SCHEDULER_TABLE_SPEC_H_

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "proto/downpour.pb.h"

namespace downpour {

// Named vectors per table: enough for L-BFGS with a history of 30.
inline constexpr int kMaxTableVectors = 64;
// Floats per key.
inline constexpr uint32_t kMaxTableWidth = 1u << 20;

// The checks that need no servers: name, kind, width, key count, named
// vectors and the initializer (the servers' Initializer::Create check).
// kInvalidArgument.
absl::Status ValidateTableShape(const proto::TableSpec& spec);

// The whole check of a new table: its shape, then its update handler against
// `plugin_names`, the plugins ("plugin:<name>") every live server has
// loaded: kInvalidArgument as above or for bad handler parameters,
// kNotFound for an unknown handler (handlers/handler.h,
// ValidateHandlerSpec).
absl::Status ValidateTableSpec(const proto::TableSpec& spec,
                               const std::vector<std::string>& plugin_names);

}  // namespace downpour

#endif  // DOWNPOUR_SCHEDULER_TABLE_SPEC_H_
