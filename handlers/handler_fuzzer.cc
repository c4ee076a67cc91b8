// Fuzzes the update-handler parameters a table declaration carries
// (HandlerSpec: a name and a map of named doubles), as the scheduler checks
// them (ValidateHandlerSpec) and the servers build them (CreateHandler, for
// built-ins and for the clipped_sgd plugin, whose create() parses them in C),
// then applies a built handler to a few rows.
//
// Checks, besides "no crash, no undefined behaviour":
//  - the scheduler and the servers agree: a built-in spec is valid exactly
//    when it builds, with the same code; a plugin that builds was valid;
//  - errors are kInvalidArgument or kNotFound;
//  - the ABI's promise that applying a batch of rows gives the same bits as
//    applying its rows one at a time.
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "handlers/handler.h"
#include "handlers/plugin_registry.h"
#include "proto/downpour.pb.h"
#include "testing/fuzz/fuzz_input.h"

namespace downpour {
namespace {

[[noreturn]] void Fail(const std::string& what,
                       const proto::HandlerSpec& spec) {
  std::fprintf(stderr, "handler_fuzzer: %s\nspec: %s\n", what.c_str(),
               spec.ShortDebugString().c_str());
  std::abort();
}

// The clipped_sgd example plugin, built next to this binary (a data
// dependency), loaded once.
const PluginRegistry& Plugins() {
  static PluginRegistry* registry = [] {
    auto* r = new PluginRegistry;
    char exe[4096];
    const ssize_t n = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
    std::string dir = n > 0 ? std::string(exe, n) : ".";
    dir = dir.substr(0, dir.rfind('/'));
    const absl::Status s = r->Load(dir + "/libclipped_sgd.so");
    if (!s.ok()) {
      std::fprintf(stderr, "handler_fuzzer: %s\n", s.ToString().c_str());
      std::abort();
    }
    return r;
  }();
  return *registry;
}

proto::HandlerSpec MakeSpec(FuzzInput& in) {
  proto::HandlerSpec spec;
  static const std::vector<std::string> kNames = {"",
                                                  "assign",
                                                  "sum",
                                                  "sgd",
                                                  "momentum",
                                                  "adagrad",
                                                  "adam",
                                                  "ftrl",
                                                  "plugin:clipped_sgd",
                                                  "plugin:missing",
                                                  "plugin:"};
  const size_t pick = in.IntInRange(0, kNames.size());
  spec.set_name(pick < kNames.size() ? kNames[pick] : in.String(24));
  static const std::vector<std::string> kParams = {"learning_rate",
                                                   "momentum",
                                                   "initial_accumulator",
                                                   "epsilon",
                                                   "beta1",
                                                   "beta2",
                                                   "alpha",
                                                   "beta",
                                                   "l1",
                                                   "l2",
                                                   "clip"};
  const int num_params = static_cast<int>(in.IntInRange(0, 5));
  for (int i = 0; i < num_params; ++i) {
    const size_t p = in.IntInRange(0, kParams.size());
    const std::string name = p < kParams.size() ? kParams[p] : in.String(16);
    (*spec.mutable_params())[name] = in.Double();
  }
  return spec;
}

// Applies `handler` to `rows` rows as one batch and row by row, from the
// same start; the results must be bitwise equal.
void CheckBatchEqualsRows(const UpdateHandler& handler, FuzzInput& in,
                          const proto::HandlerSpec& spec) {
  const size_t width = in.IntInRange(1, 9);
  const size_t rows = in.IntInRange(1, 4);
  const size_t sw = handler.StateWidth(width);
  std::vector<float> values(rows * width), grads(rows * width);
  for (float& v : values)
    v = in.Bool() ? in.Raw<float>() : in.IntInRange(0, 8) / 4.0f;
  for (float& g : grads)
    g = in.Bool() ? in.Raw<float>() : in.IntInRange(0, 8) / 4.0f - 1;
  std::vector<float> state(rows * sw);
  handler.InitState(state.data(), rows, width);
  const int steps = static_cast<int>(in.IntInRange(1, 3));
  std::vector<float> v1 = values, s1 = state, v2 = values, s2 = state;
  for (int step = 0; step < steps; ++step) {
    handler.Apply(v1.data(), sw ? s1.data() : nullptr, grads.data(), rows,
                  width);
    for (size_t r = 0; r < rows; ++r) {
      handler.Apply(v2.data() + r * width, sw ? s2.data() + r * sw : nullptr,
                    grads.data() + r * width, 1, width);
    }
  }
  // (Compared as bytes: NaN == NaN here. Empty vectors may have null data,
  // which memcmp must not get.)
  auto same = [](const std::vector<float>& a, const std::vector<float>& b) {
    return a.empty() ||
           std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
  };
  if (!same(v1, v2) || !same(s1, s2)) {
    Fail("a batch of rows and the same rows one at a time differ", spec);
  }
}

}  // namespace
}  // namespace downpour

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace downpour;
  FuzzInput in(data, size);
  const proto::HandlerSpec spec = MakeSpec(in);
  const PluginRegistry& plugins = Plugins();
  const absl::Status valid = ValidateHandlerSpec(spec, plugins.names());
  auto built = CreateHandler(spec, &plugins);
  for (const absl::Status& s : {valid, built.status()}) {
    if (!s.ok() && s.code() != absl::StatusCode::kInvalidArgument &&
        s.code() != absl::StatusCode::kNotFound) {
      Fail("unexpected code: " + s.ToString(), spec);
    }
  }
  const bool plugin = spec.name().rfind("plugin:", 0) == 0;
  if (!plugin && valid.code() != built.status().code()) {
    Fail("the scheduler says " + valid.ToString() + ", a server says " +
             built.status().ToString(),
         spec);
  }
  if (plugin && built.ok() && !valid.ok()) {
    Fail("a plugin handler builds but is not valid: " + valid.ToString(), spec);
  }
  if (built.ok()) CheckBatchEqualsRows(**built, in, spec);
  return 0;
}
