#include "planner/json.h"

#include <gtest/gtest.h>

#include <limits>

#include "common/test_util.h"

namespace downpour {
namespace planner {
namespace {

using ::testing::HasSubstr;

TEST(JsonTest, ParsesAndDumpsRoundTrip) {
  ASSERT_OK_AND_ASSIGN(Json j,
                       ParseJson(R"({"a": [1, 2.5, -3e2], "b": {"c": "x\"y\n"},
                           "d": true, "e": null})"));
  ASSERT_TRUE(j.is_object());
  ASSERT_NE(j.Find("a"), nullptr);
  EXPECT_EQ(j.Find("a")->items().size(), 3u);
  EXPECT_EQ(j.Find("a")->items()[2].number(), -300);
  EXPECT_EQ(j.Find("b")->Find("c")->string(), "x\"y\n");
  EXPECT_TRUE(j.Find("d")->boolean());
  EXPECT_TRUE(j.Find("e")->is_null());
  EXPECT_EQ(j.Dump(0),
            R"({"a":[1,2.5,-300],"b":{"c":"x\"y\n"},"d":true,"e":null})");
  ASSERT_OK_AND_ASSIGN(Json again, ParseJson(j.Dump(2)));
  EXPECT_EQ(again.Dump(0), j.Dump(0));
}

TEST(JsonTest, RemembersLines) {
  ASSERT_OK_AND_ASSIGN(Json j, ParseJson("{\n  \"a\": 1,\n  \"b\": [\n 2]}"));
  EXPECT_EQ(j.line(), 1);
  EXPECT_EQ(j.Find("a")->line(), 2);
  EXPECT_EQ(j.Find("b")->items()[0].line(), 4);
}

TEST(JsonTest, ErrorsSayWhere) {
  auto r = ParseJson("{\n  \"a\": 1,\n  \"b\": ]\n}");
  EXPECT_THAT(r, StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(r.status().message(), HasSubstr("line 3, column 8"));
  EXPECT_THAT(ParseJson("{\"a\": 1} x").status().message(),
              HasSubstr("text after"));
  EXPECT_THAT(ParseJson("{\"a\": 1, \"a\": 2}").status().message(),
              HasSubstr("appears twice"));
  EXPECT_THAT(ParseJson("[1, 2").status().message(),
              HasSubstr("expected ',' or ']'"));
  EXPECT_THAT(ParseJson("\"abc").status().message(),
              HasSubstr("unterminated string"));
  EXPECT_THAT(ParseJson("1e999").status().message(), HasSubstr("out of range"));
  EXPECT_THAT(ParseJson(std::string(100, '[')).status().message(),
              HasSubstr("nested more than 64"));
}

TEST(JsonTest, NonFiniteNumbersDumpAsNull) {
  Json j = Json::Array();
  j.Append(Json::Number(std::numeric_limits<double>::infinity()));
  EXPECT_EQ(j.Dump(0), "[null]");
}

}  // namespace
}  // namespace planner
}  // namespace downpour
