// Fuzzes the scheduler's table checks (scheduler/table_spec.h) with any
// TableSpec a peer could send in CreateTable.
//
// Input: one byte (bit 0: the servers have the clipped_sgd plugin), then a
// serialized proto::TableSpec. Besides "no crash, no undefined behaviour",
// it checks that the scheduler agrees with the servers: a spec the scheduler
// accepts is one every server can build (its initializer, and its update
// handler unless that is a plugin, whose parameters only the plugin can
// check), so that no accepted table fails on the servers.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "handlers/handler.h"
#include "handlers/initializer.h"
#include "proto/downpour.pb.h"
#include "scheduler/table_spec.h"
#include "testing/fuzz/fuzz_input.h"

namespace downpour {
namespace {

[[noreturn]] void Fail(const char* what, const absl::Status& s,
                       const proto::TableSpec& spec) {
  std::fprintf(stderr, "table_spec_fuzzer: %s: %s\nspec: %s\n", what,
               s.ToString().c_str(), spec.ShortDebugString().c_str());
  std::abort();
}

}  // namespace
}  // namespace downpour

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace downpour;
  FuzzInput in(data, size);
  std::vector<std::string> plugins;
  if (in.Bool()) plugins.push_back("plugin:clipped_sgd");
  proto::TableSpec spec;
  const std::string_view rest = in.Rest();
  if (!spec.ParseFromArray(rest.data(), static_cast<int>(rest.size()))) {
    return 0;
  }
  const absl::Status shape = ValidateTableShape(spec);
  const absl::Status full = ValidateTableSpec(spec, plugins);
  // The full check starts with the shape.
  if (!shape.ok() && full != shape)
    Fail("shape and full checks disagree", full, spec);
  if (!full.ok()) {
    if (full.code() != absl::StatusCode::kInvalidArgument &&
        full.code() != absl::StatusCode::kNotFound) {
      Fail("unexpected code", full, spec);
    }
    return 0;
  }
  if (spec.name().empty() || spec.width() < 1 ||
      spec.width() > kMaxTableWidth || spec.vectors_size() > kMaxTableVectors) {
    Fail("accepted a spec out of bounds", full, spec);
  }
  // What the servers will build (server/internal/table_shard.cc).
  if (auto init = Initializer::Create(spec.init()); !init.ok()) {
    Fail("accepted an initializer the servers refuse", init.status(), spec);
  }
  if (spec.handler().name().rfind("plugin:", 0) != 0) {
    if (auto h = CreateHandler(spec.handler(), nullptr); !h.ok()) {
      Fail("accepted a handler the servers refuse", h.status(), spec);
    }
  }
  return 0;
}
