#include "planner/model_spec.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>

#include "common/test_util.h"
#include "planner/test_fixtures.h"

namespace downpour {
namespace planner {
namespace {

using ::testing::HasSubstr;

TEST(ModelSpecTest, ReadsTheMlp) {
  ASSERT_OK_AND_ASSIGN(ModelSpec m,
                       ParseModelSpec(R"({"name": "mlp", "batch": 64,
                         "dense_layers": [784, 256, 10],
                         "handler": "momentum"})",
                                      "model file 'm'"));
  EXPECT_EQ(m.name, "mlp");
  EXPECT_EQ(m.batch, 64);
  EXPECT_EQ(m.num_layers(), 2);
  // ps_worker's MLP: 784 x 256 + 256 + 256 x 10 + 10.
  EXPECT_EQ(m.DenseFloats(), 203530);
  const std::vector<DenseBlock> blocks = m.DenseBlocks();
  ASSERT_EQ(blocks.size(), 4u);
  EXPECT_EQ(blocks[0].name, "W0");
  EXPECT_EQ(blocks[0].rows, 784);
  EXPECT_EQ(blocks[1].name, "b0");
  EXPECT_EQ(blocks[1].rows, 1);
  EXPECT_EQ(blocks[1].width, 256);
  for (Mode mode : kAllModes) EXPECT_EQ(m.HandlerFor(mode), "momentum");
}

TEST(ModelSpecTest, ReadsEmbeddingsAndPerModeHandlers) {
  ASSERT_OK_AND_ASSIGN(ModelSpec m,
                       ParseModelSpec(R"({"batch": 100, "embeddings": [
                           {"name": "ads", "rows": 1000, "width": 8,
                            "ids_per_example": 20, "unique_fraction": 0.5},
                           {"width": 4, "ids_per_example": 1}],
                         "handler": {"bsp": "sgd", "ssp": "adagrad",
                                     "asp": "ftrl"}})",
                                      "m"));
  ASSERT_EQ(m.embeddings.size(), 2u);
  EXPECT_EQ(m.embeddings[1].name, "emb1");
  // 100 x 20 x 0.5 = 1000 distinct ids, capped at the table's 1000 rows.
  EXPECT_EQ(m.DistinctIds(m.embeddings[0]), 1000);
  EXPECT_EQ(m.DistinctIds(m.embeddings[1]), 100);
  EXPECT_EQ(m.DenseFloats(), 0);
  EXPECT_EQ(m.HandlerFor(Mode::kAsp), "ftrl");
}

TEST(ModelSpecTest, RoundTripsThroughJson) {
  ASSERT_OK_AND_ASSIGN(ModelSpec m, ParseModelSpec(kTinyModel, "m"));
  ASSERT_OK_AND_ASSIGN(ModelSpec again,
                       ParseModelSpec(ModelSpecToJson(m).Dump(), "m2"));
  EXPECT_EQ(again.layer_sizes, m.layer_sizes);
  EXPECT_EQ(again.HandlerFor(Mode::kBsp), "momentum");
}

// Every bad input names the file and the field.
TEST(ModelSpecTest, BadInputNamesTheField) {
  struct Case {
    const char* text;
    const char* message;
  };
  const Case cases[] = {
      {R"({"batch": 64, "dense_layers": [784, 0, 10], "handler": "sgd"})",
       "model file 'm.json': field 'dense_layers[1]' (line 1): must be an "
       "integer in [1, 16777216]"},
      {R"({"dense_layers": [784, 10], "handler": "sgd"})",
       "model file 'm.json': field 'batch': missing"},
      {R"({"batch": "64", "dense_layers": [784, 10], "handler": "sgd"})",
       "model file 'm.json': field 'batch' (line 1): must be an integer, is a "
       "string"},
      {R"({"batch": 64, "dense_layer": [784, 10], "handler": "sgd"})",
       "field 'dense_layer' (line 1): unknown field"},
      {R"({"batch": 64, "dense_layers": [784, 10], "handler": "sgdd"})",
       "field 'handler' (line 1): unknown handler 'sgdd'"},
      {R"({"batch": 64, "dense_layers": [784, 10],
           "handler": {"bsp": "sgd", "asp": "sgd"}})",
       "field 'handler.ssp': missing"},
      {R"({"batch": 64, "embeddings": [{"width": 8, "ids_per_example": 2,
           "unique_fraction": 1.5}], "handler": "sgd"})",
       "field 'embeddings[0].unique_fraction' (line 2): must be in [0, 1], "
       "is 1.5"},
      {R"({"batch": 64, "handler": "sgd"})",
       "needs 'dense_layers' or 'embeddings'"},
      {R"({"batch": 64, "dense_layers": [784], "handler": "sgd"})",
       "field 'dense_layers' (line 1): needs at least two sizes"},
      {"{\"batch\": 64,\n \"handler\": }",
       "model file 'm.json': line 2, column 13"},
  };
  for (const Case& c : cases) {
    auto r = ParseModelSpec(c.text, "model file 'm.json'");
    EXPECT_THAT(r, StatusIs(absl::StatusCode::kInvalidArgument)) << c.text;
    EXPECT_THAT(r.status().message(), HasSubstr(c.message)) << c.text;
  }
}

TEST(ModelSpecTest, MissingFileIsNotFoundAndNamesIt) {
  auto r = ReadModelSpec("/nonexistent/model.json");
  EXPECT_THAT(r, StatusIs(absl::StatusCode::kNotFound));
  EXPECT_THAT(r.status().message(),
              HasSubstr("model file '/nonexistent/model.json'"));
}

TEST(ModelSpecTest, ReadsAFile) {
  const std::string path = ::testing::TempDir() + "/tiny.json";
  std::ofstream(path) << kTinyModel;
  ASSERT_OK_AND_ASSIGN(ModelSpec m, ReadModelSpec(path));
  EXPECT_EQ(m.name, "tiny");
  std::remove(path.c_str());
}

}  // namespace
}  // namespace planner
}  // namespace downpour
