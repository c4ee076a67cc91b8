// The update-handler plugins a server has loaded: shared objects
// implementing handlers/plugin_abi.h, opened with dlopen and kept open for
// the registry's lifetime. CreateHandler (handler.h) builds "plugin:<name>"
// handlers through it.
//
//   PluginRegistry plugins;
//   DP_RETURN_IF_ERROR(plugins.Load("/opt/plugins/libclipped_sgd.so"));
//   for (const std::string& n : plugins.names()) req.add_plugin_handlers(n);
//   CreateHandler(spec, &plugins);  // spec.name() == "plugin:clipped_sgd"
//
// Thread-safe: Load, names and CreateHandler may be called concurrently.
// The registry must outlive every handler created from it (its destructor
// unloads the libraries whose code those handlers run).
#ifndef DOWNPOUR_HANDLERS_PLUGIN_REGISTRY_H_
#define DOWNPOUR_HANDLERS_PLUGIN_REGISTRY_H_

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "handlers/handler.h"
#include "proto/downpour.pb.h"

namespace downpour {

class PluginRegistry {
 public:
  PluginRegistry();
  ~PluginRegistry();  // dlcloses every loaded library
  PluginRegistry(const PluginRegistry&) = delete;
  PluginRegistry& operator=(const PluginRegistry&) = delete;

  // Loads the plugin at `path` (dlopen semantics: a path without '/' is
  // searched for in the library path). Runs the library's initializers.
  // Errors:
  //   kNotFound         dlopen failed (missing file, not a shared object,
  //                     unresolved dependencies); the message has dlerror().
  //   kInvalidArgument  not a plugin: no downpour_update_handler_v1 symbol,
  //                     a NULL descriptor, another ABI version, a bad name
  //                     (empty, or characters other than [A-Za-z0-9_.-]),
  //                     or a NULL create/destroy/state_width/apply.
  //   kAlreadyExists    a plugin of that name is loaded already (also when
  //                     the same file is loaded twice); the registry keeps
  //                     the first one.
  // On error nothing is registered and the library is closed again.
  absl::Status Load(const std::string& path) ABSL_LOCKS_EXCLUDED(mu_);

  // The loaded handlers as tables name them ("plugin:<name>"), sorted.
  std::vector<std::string> names() const ABSL_LOCKS_EXCLUDED(mu_);

  // Builds an instance of the plugin `spec.name()` ("plugin:<name>") with
  // `spec.params()`. kNotFound if no such plugin is loaded,
  // kInvalidArgument with the plugin's message if its create() refuses the
  // parameters. Prefer the free CreateHandler, which also serves built-ins.
  absl::StatusOr<std::unique_ptr<UpdateHandler>> CreateHandler(
      const proto::HandlerSpec& spec) const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  struct Plugin;

  mutable absl::Mutex mu_;
  // Keyed by the plugin's own name (without "plugin:"). Entries are never
  // removed before the destructor, so a Plugin* stays valid without mu_.
  std::map<std::string, std::unique_ptr<Plugin>> plugins_ ABSL_GUARDED_BY(mu_);
};

}  // namespace downpour

#endif  // DOWNPOUR_HANDLERS_PLUGIN_REGISTRY_H_
