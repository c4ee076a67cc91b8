#include "handlers/handler.h"

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <initializer_list>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"
#include "handlers/internal/builtin_handlers.h"
#include "handlers/plugin_registry.h"

namespace downpour {
namespace {

using handlers_internal::NewAdagradHandler;
using handlers_internal::NewAdamHandler;
using handlers_internal::NewAssignHandler;
using handlers_internal::NewFtrlHandler;
using handlers_internal::NewMomentumHandler;
using handlers_internal::NewRowwiseAdagradHandler;
using handlers_internal::NewSgdHandler;
using handlers_internal::NewSumHandler;

constexpr char kDefaultHandler[] = "sgd";
constexpr const char* kBuiltinNames[] = {
    "assign",          "sum",  "sgd", "momentum", "adagrad",
    "rowwise_adagrad", "adam", "ftrl"};

struct ParamDef {
  const char* name;
  double default_value;
};

// The spec's parameters in the order of `defs`, defaults filled in. Rejects
// names not in `defs` and values that are not finite floats (the kernels
// compute in float). Keys are visited sorted so that the error for a spec
// with several bad parameters does not depend on the map's hash order.
absl::StatusOr<std::vector<double>> ReadParams(
    const std::string& handler, const proto::HandlerSpec& spec,
    std::initializer_list<ParamDef> defs) {
  std::vector<std::pair<std::string, double>> given(spec.params().begin(),
                                                    spec.params().end());
  std::sort(given.begin(), given.end());
  std::vector<double> values;
  for (const ParamDef& def : defs) values.push_back(def.default_value);
  for (const auto& [name, value] : given) {
    size_t i = 0;
    for (const ParamDef& def : defs) {
      if (name == def.name) break;
      ++i;
    }
    if (i == defs.size()) {
      std::vector<std::string> known;
      for (const ParamDef& def : defs) known.push_back(def.name);
      return absl::InvalidArgumentError(absl::StrCat(
          "handler '", handler, "' has no parameter '", name, "' (",
          known.empty() ? "it takes none"
                        : absl::StrCat("it takes ", absl::StrJoin(known, ", ")),
          ")"));
    }
    if (!std::isfinite(value) || std::abs(value) > FLT_MAX) {
      return absl::InvalidArgumentError(
          absl::StrCat("handler '", handler, "': parameter '", name, "' is ",
                       value, ", not a finite float"));
    }
    values[i] = value;
  }
  return values;
}

absl::Status OutOfRange(const std::string& handler, const char* param,
                        double value, const char* requirement) {
  return absl::InvalidArgumentError(
      absl::StrCat("handler '", handler, "': parameter '", param, "' is ",
                   value, ", must be ", requirement));
}

absl::Status CheckNonNegative(const std::string& handler, const char* param,
                              double value) {
  if (value >= 0) return absl::OkStatus();
  return OutOfRange(handler, param, value, ">= 0");
}

// Decay rates: 1 would never forget (and makes Adam's bias correction 0/0).
absl::Status CheckDecay(const std::string& handler, const char* param,
                        double value) {
  if (value >= 0 && value < 1) return absl::OkStatus();
  return OutOfRange(handler, param, value, "in [0, 1)");
}

absl::StatusOr<std::unique_ptr<UpdateHandler>> CreateBuiltin(
    const proto::HandlerSpec& spec) {
  const std::string name = spec.name().empty() ? kDefaultHandler : spec.name();
  if (name == "assign" || name == "sum") {
    DP_RETURN_IF_ERROR(ReadParams(name, spec, {}).status());
    return name == "assign" ? NewAssignHandler() : NewSumHandler();
  }
  if (name == "sgd") {
    DP_ASSIGN_OR_RETURN(std::vector<double> p,
                        ReadParams(name, spec, {{"learning_rate", 0.01}}));
    DP_RETURN_IF_ERROR(CheckNonNegative(name, "learning_rate", p[0]));
    return NewSgdHandler(static_cast<float>(p[0]));
  }
  if (name == "momentum") {
    DP_ASSIGN_OR_RETURN(
        std::vector<double> p,
        ReadParams(name, spec, {{"learning_rate", 0.01}, {"momentum", 0.9}}));
    DP_RETURN_IF_ERROR(CheckNonNegative(name, "learning_rate", p[0]));
    DP_RETURN_IF_ERROR(CheckDecay(name, "momentum", p[1]));
    return NewMomentumHandler(static_cast<float>(p[0]),
                              static_cast<float>(p[1]));
  }
  if (name == "adagrad" || name == "rowwise_adagrad") {
    DP_ASSIGN_OR_RETURN(std::vector<double> p,
                        ReadParams(name, spec,
                                   {{"learning_rate", 0.01},
                                    {"initial_accumulator", 0.0},
                                    {"epsilon", 1e-8}}));
    DP_RETURN_IF_ERROR(CheckNonNegative(name, "learning_rate", p[0]));
    DP_RETURN_IF_ERROR(CheckNonNegative(name, "initial_accumulator", p[1]));
    DP_RETURN_IF_ERROR(CheckNonNegative(name, "epsilon", p[2]));
    // With both 0, a zero gradient on a fresh row computes 0 / 0.
    if (static_cast<float>(p[1]) == 0 && static_cast<float>(p[2]) == 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "handler '", name,
          "': epsilon or initial_accumulator must be > 0 (with both 0 a zero "
          "gradient on a fresh row divides 0 by 0)"));
    }
    const float lr = static_cast<float>(p[0]);
    const float init = static_cast<float>(p[1]);
    const float eps = static_cast<float>(p[2]);
    return name == "adagrad" ? NewAdagradHandler(lr, init, eps)
                             : NewRowwiseAdagradHandler(lr, init, eps);
  }
  if (name == "adam") {
    DP_ASSIGN_OR_RETURN(std::vector<double> p,
                        ReadParams(name, spec,
                                   {{"learning_rate", 0.001},
                                    {"beta1", 0.9},
                                    {"beta2", 0.999},
                                    {"epsilon", 1e-8}}));
    DP_RETURN_IF_ERROR(CheckNonNegative(name, "learning_rate", p[0]));
    DP_RETURN_IF_ERROR(CheckDecay(name, "beta1", p[1]));
    DP_RETURN_IF_ERROR(CheckDecay(name, "beta2", p[2]));
    // A zero gradient on a fresh row has m = v = 0: epsilon is all that
    // keeps the step from being 0 / 0.
    if (!(static_cast<float>(p[3]) > 0)) {
      return OutOfRange(name, "epsilon", p[3], "> 0");
    }
    return NewAdamHandler(static_cast<float>(p[0]), p[1], p[2],
                          static_cast<float>(p[3]));
  }
  if (name == "ftrl") {
    DP_ASSIGN_OR_RETURN(
        std::vector<double> p,
        ReadParams(name, spec,
                   {{"alpha", 0.05}, {"beta", 1.0}, {"l1", 0.0}, {"l2", 0.0}}));
    // The kernel multiplies by 1 / alpha, which must be a finite float too.
    if (!(p[0] > 0 && std::isfinite(1.0f / static_cast<float>(p[0])))) {
      return OutOfRange(name, "alpha", p[0], "> 0 (and 1/alpha finite)");
    }
    DP_RETURN_IF_ERROR(CheckNonNegative(name, "beta", p[1]));
    DP_RETURN_IF_ERROR(CheckNonNegative(name, "l1", p[2]));
    DP_RETURN_IF_ERROR(CheckNonNegative(name, "l2", p[3]));
    return NewFtrlHandler(static_cast<float>(p[0]), static_cast<float>(p[1]),
                          static_cast<float>(p[2]), static_cast<float>(p[3]));
  }
  return absl::NotFoundError(
      absl::StrCat("unknown update handler '", name,
                   "' (built in: ", absl::StrJoin(kBuiltinNames, ", "),
                   "; a plugin is named '", kPluginHandlerPrefix, "<name>')"));
}

}  // namespace

void UpdateHandler::ApplyScattered(float* values, float* state,
                                   const uint64_t* rows, uint64_t base,
                                   size_t n, const float* grads,
                                   size_t width) const {
  const size_t sw = StateWidth(width);
  for (size_t i = 0; i < n; ++i) {
    const size_t r = rows[i] - base;
    Apply(values + r * width, sw ? state + r * sw : nullptr, grads + i * width,
          1, width);
  }
}

absl::StatusOr<std::unique_ptr<UpdateHandler>> CreateHandler(
    const proto::HandlerSpec& spec, const PluginRegistry* plugins) {
  if (absl::StartsWith(spec.name(), kPluginHandlerPrefix)) {
    if (plugins == nullptr) {
      return absl::NotFoundError(absl::StrCat("update handler '", spec.name(),
                                              "': no plugins are loaded"));
    }
    return plugins->CreateHandler(spec);
  }
  return CreateBuiltin(spec);
}

absl::Status ValidateHandlerSpec(const proto::HandlerSpec& spec,
                                 const std::vector<std::string>& plugin_names) {
  if (absl::StartsWith(spec.name(), kPluginHandlerPrefix)) {
    if (std::find(plugin_names.begin(), plugin_names.end(), spec.name()) !=
        plugin_names.end()) {
      return absl::OkStatus();
    }
    return absl::NotFoundError(absl::StrCat(
        "update handler '", spec.name(), "' is not loaded (loaded: ",
        plugin_names.empty() ? "none" : absl::StrJoin(plugin_names, ", "),
        ")"));
  }
  // Building a built-in handler is cheap and allocates no per-row memory, so
  // validating by building keeps the two paths' errors identical.
  return CreateBuiltin(spec).status();
}

}  // namespace downpour
