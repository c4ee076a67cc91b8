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
// Bounded sparse tables: a cap of at most 2^40 rows (far beyond any
// server's memory: capacity.h refuses what does not fit), TTLs below 2^31
// (a row's stamp is 32 bits), and an admission threshold of at most 10^6
// pushes (counts are exact in a float).
inline constexpr int64_t kMaxTableRows = int64_t{1} << 40;
inline constexpr int64_t kMaxTtl = (int64_t{1} << 31) - 1;
inline constexpr int64_t kMaxAdmitAfter = 1000000;

// The checks that need no servers: name, kind, width, key count, named
// vectors, a sparse table's bounds and the initializer (the servers'
// Initializer::Create check). kInvalidArgument naming the field.
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
