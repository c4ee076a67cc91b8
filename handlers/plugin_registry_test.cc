#include "handlers/plugin_registry.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "common/test_util.h"
#include "handlers/handler.h"

namespace downpour {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

std::string Plugin(const std::string& file) {
  return RunfilePath("handlers/" + file);
}

proto::HandlerSpec Spec(const std::string& name,
                        const std::map<std::string, double>& params = {}) {
  proto::HandlerSpec spec;
  spec.set_name(name);
  for (const auto& [k, v] : params) (*spec.mutable_params())[k] = v;
  return spec;
}

float Clamp(float g, float clip) { return std::min(clip, std::max(-clip, g)); }

TEST(PluginRegistryTest, LoadsExampleAndAppliesIt) {
  PluginRegistry plugins;
  EXPECT_THAT(plugins.names(), ElementsAre());
  ASSERT_OK(plugins.Load(Plugin("libclipped_sgd.so")));
  EXPECT_THAT(plugins.names(), ElementsAre("plugin:clipped_sgd"));

  auto handler = CreateHandler(
      Spec("plugin:clipped_sgd", {{"learning_rate", 0.5}, {"clip", 0.25}}),
      &plugins);
  ASSERT_OK(handler);
  EXPECT_EQ((*handler)->name(), "plugin:clipped_sgd");
  EXPECT_EQ((*handler)->StateWidth(3), 0u);

  const std::vector<float> grads = {0.1f, -0.2f, 3.0f, -7.0f, 0.25f, 0.0f};
  std::vector<float> values = {1, 2, 3, 4, 5, 6};
  std::vector<float> expected = values;
  for (int step = 0; step < 3; ++step) {
    (*handler)->Apply(values.data(), nullptr, grads.data(), 2, 3);
    for (size_t i = 0; i < expected.size(); ++i) {
      expected[i] -= 0.5f * Clamp(grads[i], 0.25f);
    }
  }
  for (size_t i = 0; i < expected.size(); ++i) {
    EXPECT_FLOAT_EQ(values[i], expected[i]) << i;
  }
}

TEST(PluginRegistryTest, ExampleDefaults) {
  PluginRegistry plugins;
  ASSERT_OK(plugins.Load(Plugin("libclipped_sgd.so")));
  auto handler = CreateHandler(Spec("plugin:clipped_sgd"), &plugins);
  ASSERT_OK(handler);
  // learning_rate 0.01, clip 1.
  float values[3] = {0, 0, 0};
  const float grads[3] = {0.5f, 4.0f, -4.0f};
  (*handler)->Apply(values, nullptr, grads, 1, 3);
  EXPECT_FLOAT_EQ(values[0], -0.005f);
  EXPECT_FLOAT_EQ(values[1], -0.01f);
  EXPECT_FLOAT_EQ(values[2], 0.01f);
  // A stateless plugin without init_state: InitState writes nothing.
  (*handler)->InitState(nullptr, 4, 3);
}

TEST(PluginRegistryTest, ExampleRejectsBadParams) {
  PluginRegistry plugins;
  ASSERT_OK(plugins.Load(Plugin("libclipped_sgd.so")));
  auto unknown =
      CreateHandler(Spec("plugin:clipped_sgd", {{"clipp", 1}}), &plugins);
  EXPECT_THAT(unknown, StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(std::string(unknown.status().message()), HasSubstr("'clipp'"));
  EXPECT_THAT(std::string(unknown.status().message()),
              HasSubstr("plugin:clipped_sgd"));
  for (double clip : {0.0, -1.0, std::nan("")}) {
    auto bad =
        CreateHandler(Spec("plugin:clipped_sgd", {{"clip", clip}}), &plugins);
    EXPECT_THAT(bad, StatusIs(absl::StatusCode::kInvalidArgument)) << clip;
    EXPECT_THAT(std::string(bad.status().message()), HasSubstr("clip"));
  }
  EXPECT_THAT(CreateHandler(Spec("plugin:clipped_sgd", {{"learning_rate", -1}}),
                            &plugins),
              StatusIs(absl::StatusCode::kInvalidArgument));
}

TEST(PluginRegistryTest, UnloadedPluginIsNotFound) {
  PluginRegistry plugins;
  ASSERT_OK(plugins.Load(Plugin("libclipped_sgd.so")));
  EXPECT_THAT(CreateHandler(Spec("plugin:other"), &plugins),
              StatusIs(absl::StatusCode::kNotFound));
  EXPECT_THAT(CreateHandler(Spec("plugin:"), &plugins),
              StatusIs(absl::StatusCode::kNotFound));
  // The registry itself only builds plugins.
  EXPECT_THAT(plugins.CreateHandler(Spec("sgd")),
              StatusIs(absl::StatusCode::kNotFound));
  // Built-ins still work with a registry.
  EXPECT_OK(CreateHandler(Spec("adam"), &plugins));
}

TEST(PluginRegistryTest, MissingFileIsNotFound) {
  PluginRegistry plugins;
  const std::string path = TestTmpDir() + "/no_such_plugin.so";
  absl::Status s = plugins.Load(path);
  EXPECT_THAT(s, StatusIs(absl::StatusCode::kNotFound));
  EXPECT_THAT(std::string(s.message()), HasSubstr("no_such_plugin.so"));
  EXPECT_THAT(plugins.names(), ElementsAre());
}

TEST(PluginRegistryTest, SharedObjectWithoutEntryPointIsInvalid) {
  PluginRegistry plugins;
  absl::Status s = plugins.Load(Plugin("libtest_no_symbol.so"));
  EXPECT_THAT(s, StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(std::string(s.message()),
              HasSubstr("downpour_update_handler_v1"));
  EXPECT_THAT(plugins.names(), ElementsAre());
}

TEST(PluginRegistryTest, BrokenDescriptorsAreInvalid) {
  PluginRegistry plugins;
  for (const char* file : {"libtest_wrong_abi.so", "libtest_empty_name.so",
                           "libtest_missing_apply.so"}) {
    EXPECT_THAT(plugins.Load(Plugin(file)),
                StatusIs(absl::StatusCode::kInvalidArgument))
        << file;
  }
  EXPECT_THAT(
      std::string(plugins.Load(Plugin("libtest_wrong_abi.so")).message()),
      HasSubstr("999"));
  EXPECT_THAT(
      std::string(plugins.Load(Plugin("libtest_missing_apply.so")).message()),
      HasSubstr("apply"));
  EXPECT_THAT(plugins.names(), ElementsAre());
}

// A second plugin of the same name is refused with kAlreadyExists, whether
// it is the same file again or another library; the first one stays.
TEST(PluginRegistryTest, DuplicateNameIsAlreadyExists) {
  PluginRegistry plugins;
  ASSERT_OK(plugins.Load(Plugin("libclipped_sgd.so")));
  EXPECT_THAT(plugins.Load(Plugin("libclipped_sgd.so")),
              StatusIs(absl::StatusCode::kAlreadyExists));
  EXPECT_THAT(plugins.Load(Plugin("libtest_duplicate_name.so")),
              StatusIs(absl::StatusCode::kAlreadyExists));
  EXPECT_THAT(plugins.names(), ElementsAre("plugin:clipped_sgd"));

  // Still the clipped one (the duplicate adds the gradient instead).
  auto handler = CreateHandler(
      Spec("plugin:clipped_sgd", {{"learning_rate", 1}}), &plugins);
  ASSERT_OK(handler);
  float value = 0;
  const float grad = 5;
  (*handler)->Apply(&value, nullptr, &grad, 1, 1);
  EXPECT_FLOAT_EQ(value, -1.0f);
}

// Several registries (several servers in one test process) load the same
// library independently; dlopen's reference count keeps it loaded until the
// last one goes.
TEST(PluginRegistryTest, IndependentRegistries) {
  auto first = std::make_unique<PluginRegistry>();
  PluginRegistry second;
  ASSERT_OK(first->Load(Plugin("libclipped_sgd.so")));
  ASSERT_OK(second.Load(Plugin("libclipped_sgd.so")));
  first.reset();
  auto handler = CreateHandler(Spec("plugin:clipped_sgd"), &second);
  ASSERT_OK(handler);
  float value = 1;
  const float grad = 1;
  (*handler)->Apply(&value, nullptr, &grad, 1, 1);
  EXPECT_FLOAT_EQ(value, 0.99f);
}

TEST(PluginRegistryTest, ValidateAgainstLoadedNames) {
  PluginRegistry plugins;
  ASSERT_OK(plugins.Load(Plugin("libclipped_sgd.so")));
  EXPECT_OK(ValidateHandlerSpec(Spec("plugin:clipped_sgd"), plugins.names()));
  EXPECT_THAT(ValidateHandlerSpec(Spec("plugin:nope"), plugins.names()),
              StatusIs(absl::StatusCode::kNotFound));
}

// Load, names and CreateHandler from several threads, and one plugin
// instance applied concurrently to disjoint rows.
TEST(PluginRegistryTest, ConcurrentUse) {
  PluginRegistry plugins;
  std::vector<std::thread> threads;
  std::vector<absl::Status> load_status(4);
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back(
        [&, t] { load_status[t] = plugins.Load(Plugin("libclipped_sgd.so")); });
  }
  for (std::thread& th : threads) th.join();
  threads.clear();
  EXPECT_EQ(std::count_if(load_status.begin(), load_status.end(),
                          [](const absl::Status& s) { return s.ok(); }),
            1);
  for (const absl::Status& s : load_status) {
    if (!s.ok()) {
      EXPECT_THAT(s, StatusIs(absl::StatusCode::kAlreadyExists));
    }
  }

  auto handler =
      CreateHandler(Spec("plugin:clipped_sgd", {{"clip", 0.5}}), &plugins);
  ASSERT_OK(handler);
  constexpr size_t kRowsPerThread = 1000, kWidth = 4;
  std::vector<float> values(4 * kRowsPerThread * kWidth, 0.0f);
  const std::vector<float> grads(values.size(), 2.0f);
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      EXPECT_THAT(plugins.names(), ElementsAre("plugin:clipped_sgd"));
      EXPECT_OK(CreateHandler(Spec("plugin:clipped_sgd"), &plugins));
      const size_t offset = t * kRowsPerThread * kWidth;
      for (int step = 0; step < 10; ++step) {
        (*handler)->Apply(values.data() + offset, nullptr,
                          grads.data() + offset, kRowsPerThread, kWidth);
      }
    });
  }
  for (std::thread& th : threads) th.join();
  for (float v : values) ASSERT_NEAR(v, -0.05f, 1e-6f);
}

}  // namespace
}  // namespace downpour
