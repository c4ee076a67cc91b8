#include "handlers/plugin_registry.h"

#include <dlfcn.h>

#include <algorithm>
#include <cstring>
#include <utility>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "common/logging.h"
#include "handlers/plugin_abi.h"

namespace downpour {

struct PluginRegistry::Plugin {
  std::string path;
  void* handle;  // from dlopen, closed by ~PluginRegistry
  const DpUpdateHandlerV1* api;
};

namespace {

// Adapts one plugin instance to UpdateHandler. `api` lives in a library the
// registry keeps open, which is why the registry must outlive its handlers.
class PluginHandler final : public UpdateHandler {
 public:
  PluginHandler(std::string name, const DpUpdateHandlerV1* api, void* instance)
      : name_(std::move(name)), api_(api), instance_(instance) {}
  ~PluginHandler() override { api_->destroy(instance_); }

  const std::string& name() const override { return name_; }
  size_t StateWidth(size_t width) const override {
    return api_->state_width(instance_, width);
  }
  void InitState(float* state, size_t rows, size_t width) const override {
    if (api_->init_state != nullptr) {
      api_->init_state(instance_, state, rows, width);
      return;
    }
    const size_t n = rows * StateWidth(width);
    if (n > 0) std::memset(state, 0, n * sizeof(float));
  }
  void Apply(float* values, float* state, const float* grads, size_t rows,
             size_t width) const override {
    api_->apply(instance_, values, state, grads, rows, width);
  }

 private:
  const std::string name_;
  const DpUpdateHandlerV1* const api_;
  void* const instance_;
};

bool IsValidPluginName(const char* name) {
  if (name == nullptr || *name == '\0') return false;
  for (const char* c = name; *c != '\0'; ++c) {
    if (!absl::ascii_isalnum(*c) && *c != '_' && *c != '-' && *c != '.') {
      return false;
    }
  }
  return true;
}

// Checks a descriptor; the message continues "handler plugin '<path>' ...".
absl::Status CheckDescriptor(const DpUpdateHandlerV1* api) {
  if (api == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(
        "returned NULL from ", DOWNPOUR_UPDATE_HANDLER_V1_SYMBOL, "()"));
  }
  if (api->abi_version != DOWNPOUR_HANDLER_ABI_VERSION) {
    return absl::InvalidArgumentError(absl::StrCat(
        "has handler ABI version ", api->abi_version,
        ", this server supports version ", DOWNPOUR_HANDLER_ABI_VERSION));
  }
  if (!IsValidPluginName(api->name)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "has an invalid handler name '", api->name ? api->name : "(null)",
        "' (want a non-empty name of letters, digits, '_', '-', '.')"));
  }
  std::vector<const char*> missing;
  if (api->create == nullptr) missing.push_back("create");
  if (api->destroy == nullptr) missing.push_back("destroy");
  if (api->state_width == nullptr) missing.push_back("state_width");
  if (api->apply == nullptr) missing.push_back("apply");
  if (!missing.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "('", api->name,
        "') has NULL function(s): ", absl::StrJoin(missing, ", ")));
  }
  return absl::OkStatus();
}

}  // namespace

PluginRegistry::PluginRegistry() = default;

PluginRegistry::~PluginRegistry() {
  absl::MutexLock lock(&mu_);
  for (auto& [name, plugin] : plugins_) dlclose(plugin->handle);
}

absl::Status PluginRegistry::Load(const std::string& path) {
  // dlopen reads files and runs the library's initializers: done without
  // mu_. RTLD_LOCAL keeps each plugin's symbols to itself, so two plugins
  // may define the same helper names; RTLD_NOW reports unresolved symbols
  // here rather than on the first push.
  void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr) {
    const char* error = dlerror();
    return absl::NotFoundError(
        absl::StrCat("cannot load handler plugin '", path,
                     "': ", error != nullptr ? error : "dlopen failed"));
  }
  // Closes the library on every error path; released once registered.
  // dlopen counts references, so closing after loading an already loaded
  // file again leaves the first registration intact.
  absl::Cleanup close_on_error = [handle] { dlclose(handle); };

  dlerror();  // clears any stale error, as dlsym's documentation asks
  void* symbol = dlsym(handle, DOWNPOUR_UPDATE_HANDLER_V1_SYMBOL);
  if (symbol == nullptr) {
    const char* error = dlerror();
    return absl::InvalidArgumentError(absl::StrCat(
        "'", path, "' is not a Downpour handler plugin: it does not export ",
        DOWNPOUR_UPDATE_HANDLER_V1_SYMBOL,
        error != nullptr ? absl::StrCat(" (", error, ")") : ""));
  }
  // Function pointers and void* have the same representation on every
  // platform dlsym exists on (POSIX requires it).
  const DpUpdateHandlerV1* api =
      reinterpret_cast<DpUpdateHandlerV1Getter>(symbol)();
  if (absl::Status s = CheckDescriptor(api); !s.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("handler plugin '", path, "' ", s.message()));
  }

  const std::string name = api->name;
  {
    absl::MutexLock lock(&mu_);
    auto it = plugins_.find(name);
    if (it != plugins_.end()) {
      return absl::AlreadyExistsError(
          absl::StrCat("handler plugin '", name, "' from '", path,
                       "' is already loaded (from '", it->second->path, "')"));
    }
    plugins_.emplace(name,
                     std::unique_ptr<Plugin>(new Plugin{path, handle, api}));
  }
  std::move(close_on_error).Cancel();
  DP_LOG(INFO) << "loaded update handler '" << kPluginHandlerPrefix << name
               << "' from " << path;
  return absl::OkStatus();
}

std::vector<std::string> PluginRegistry::names() const {
  absl::MutexLock lock(&mu_);
  std::vector<std::string> names;
  names.reserve(plugins_.size());
  for (const auto& [name, plugin] : plugins_) {
    names.push_back(absl::StrCat(kPluginHandlerPrefix, name));
  }
  return names;
}

absl::StatusOr<std::unique_ptr<UpdateHandler>> PluginRegistry::CreateHandler(
    const proto::HandlerSpec& spec) const {
  absl::string_view name = spec.name();
  if (!absl::ConsumePrefix(&name, kPluginHandlerPrefix)) {
    return absl::NotFoundError(
        absl::StrCat("update handler '", spec.name(),
                     "' is not a plugin (plugins are named '",
                     kPluginHandlerPrefix, "<name>')"));
  }
  const DpUpdateHandlerV1* api = nullptr;
  {
    absl::MutexLock lock(&mu_);
    auto it = plugins_.find(std::string(name));
    if (it == plugins_.end()) {
      std::vector<std::string> loaded;
      for (const auto& entry : plugins_) loaded.push_back(entry.first);
      return absl::NotFoundError(absl::StrCat(
          "update handler '", spec.name(), "': no plugin '", name,
          "' is loaded (loaded: ",
          loaded.empty() ? "none" : absl::StrJoin(loaded, ", "), ")"));
    }
    api = it->second->api;
  }

  // Sorted so that a plugin sees its parameters in the same order on every
  // server (the proto map's order is unspecified). The names point into
  // `spec`, which outlives the create() call.
  std::vector<DpHandlerParam> params;
  params.reserve(spec.params().size());
  for (const auto& [key, value] : spec.params()) {
    params.push_back(DpHandlerParam{key.c_str(), value});
  }
  std::sort(params.begin(), params.end(),
            [](const DpHandlerParam& a, const DpHandlerParam& b) {
              return std::strcmp(a.name, b.name) < 0;
            });

  char error[1024] = {0};
  void* instance =
      api->create(params.data(), params.size(), error, sizeof(error));
  error[sizeof(error) - 1] = '\0';  // in case the plugin forgot the NUL
  if (instance == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(
        "handler '", spec.name(), "': ",
        error[0] != '\0' ? error
                         : "the plugin's create() failed without a "
                           "message"));
  }
  return std::unique_ptr<UpdateHandler>(
      new PluginHandler(spec.name(), api, instance));
}

}  // namespace downpour
