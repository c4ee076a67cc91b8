// Update handlers: the rule a server applies when a worker pushes gradients
// to a table ("push"), and the factory that builds one from a table's
// HandlerSpec.
//
//   DP_ASSIGN_OR_RETURN(std::unique_ptr<UpdateHandler> handler,
//                       CreateHandler(spec.handler(), &plugins));
//   std::unique_ptr<float[]> state(new float[rows * handler->StateWidth(w)]);
//   handler->InitState(state.get(), rows, w);
//   handler->Apply(values, state.get(), grads, rows, w);
//
// Built-in handlers (HandlerSpec.name; parameters and defaults):
//   "assign"    value = g.                                       (no params)
//   "sum"       value += g.                                      (no params)
//   "sgd"       w -= lr*g.                   learning_rate=0.01
//   "momentum"  v = mu*v + g; w -= lr*v.     learning_rate=0.01 momentum=0.9
//   "adagrad"   h += g^2; w -= lr*g/(sqrt(h)+eps).
//               learning_rate=0.01 initial_accumulator=0 epsilon=1e-8
//   "rowwise_adagrad"  one accumulator per row (TorchRec / FBGEMM's
//               row-wise Adagrad, for embeddings: 1 float of state per row
//               instead of width): h += mean over the row of g^2;
//               w -= (lr / (sqrt(h) + eps)) * g.
//               learning_rate=0.01 initial_accumulator=0 epsilon=1e-8
//   "adam"      bias-corrected Adam (Kingma & Ba) with a per-row step count.
//               learning_rate=0.001 beta1=0.9 beta2=0.999 epsilon=1e-8
//   "ftrl"      FTRL-proximal (McMahan et al. 2013), per coordinate.
//               alpha=0.05 beta=1 l1=0 l2=0
// An empty name means "sgd" (the common case for a parameter table). A
// plugin loaded into a PluginRegistry is named "plugin:<name>".
//
// Parameter checks (kInvalidArgument): every parameter must be one the
// handler takes (so that a typo such as "learning_rat" is not silently
// ignored), finite as a float, and in range: learning_rate >= 0,
// momentum/beta1/beta2 in [0, 1), adam epsilon > 0, adagrad and
// rowwise_adagrad need epsilon > 0 or initial_accumulator > 0, ftrl
// alpha > 0 and beta, l1, l2 >= 0.
#ifndef DOWNPOUR_HANDLERS_HANDLER_H_
#define DOWNPOUR_HANDLERS_HANDLER_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "proto/downpour.pb.h"

namespace downpour {

// Prefix of the names of handlers that plugins provide: "plugin:<name>".
inline constexpr char kPluginHandlerPrefix[] = "plugin:";

// An update rule the server applies to rows of a table. Stateless apart from
// the per-row state the server stores beside each row; that state is opaque
// (Adam keeps an integer step count in it): store and copy it bitwise, never
// do arithmetic on it.
// Thread-safe: Apply and InitState may run concurrently on disjoint rows.
class UpdateHandler {
 public:
  virtual ~UpdateHandler() = default;

  // The spec's name, e.g. "adam" or "plugin:clipped_sgd" ("sgd" for an
  // empty spec name).
  virtual const std::string& name() const = 0;

  // Floats of per-row state kept beside a row of `width` values (0 for
  // stateless rules). A pure function of `width`.
  virtual size_t StateWidth(size_t width) const = 0;

  // Initializes the state of `rows` contiguous rows; `state` holds
  // rows * StateWidth(width) floats.
  virtual void InitState(float* state, size_t rows, size_t width) const = 0;

  // Applies gradients to `rows` contiguous rows: `values` and `grads` hold
  // rows * width floats, `state` rows * StateWidth(width) floats (it may be
  // null when StateWidth(width) is 0). Applying a batch of rows gives the
  // same result as applying its rows one at a time.
  // REQUIRES: the three arrays do not overlap.
  virtual void Apply(float* values, float* state, const float* grads,
                     size_t rows, size_t width) const = 0;

  // Applies gradient row i (grads + i * width) to row rows[i] - base of a
  // block (`values` in rows of `width`, `state` in rows of
  // StateWidth(width), null when that is 0), for i in [0, n) in order; a
  // row may repeat. The same bits as Apply on one row at a time, which is
  // what this default does: the built-in rules override it so that a
  // keyed push to a dense range costs one virtual call, not one a key.
  virtual void ApplyScattered(float* values, float* state, const uint64_t* rows,
                              uint64_t base, size_t n, const float* grads,
                              size_t width) const;
};

class PluginRegistry;

// Builds the handler `spec` names. `plugins` (may be null: no plugins) is
// consulted for "plugin:<name>" specs and must outlive the handler.
// Errors: kNotFound for an unknown handler name or a plugin that is not
// loaded; kInvalidArgument for an unknown parameter name or a bad value
// (for a plugin: whatever its create() rejects, with its message).
absl::StatusOr<std::unique_ptr<UpdateHandler>> CreateHandler(
    const proto::HandlerSpec& spec, const PluginRegistry* plugins);

// Checks `spec` without a PluginRegistry, with the same errors as
// CreateHandler (e.g. in the scheduler, which loads no plugins). Plugin
// names are checked against `plugin_names` (entries like
// "plugin:clipped_sgd", as PluginRegistry::names() returns them); a plugin's
// parameters can only be checked by building it, so they are not checked.
absl::Status ValidateHandlerSpec(const proto::HandlerSpec& spec,
                                 const std::vector<std::string>& plugin_names);

}  // namespace downpour

#endif  // DOWNPOUR_HANDLERS_HANDLER_H_
