#include "planner/object_reader.h"

#include <gtest/gtest.h>

#include "common/test_util.h"

namespace downpour {
namespace planner {
namespace {

using ::testing::HasSubstr;

TEST(ObjectReaderTest, ReadsTypedMembers) {
  ASSERT_OK_AND_ASSIGN(Json j,
                       ParseJson(R"({"n": 2.5, "i": 7, "s": "x", "b": true})"));
  ObjectReader r(j, "test file 't'");
  EXPECT_EQ(r.Number("n"), 2.5);
  EXPECT_EQ(r.Int("i", 1, 10), 7);
  EXPECT_EQ(r.String("s"), "x");
  EXPECT_TRUE(r.OptionalBool("b", false));
  EXPECT_EQ(r.OptionalInt("missing", 42), 42);
  EXPECT_OK(r.Finish());
}

TEST(ObjectReaderTest, ErrorsNameTheFileTheFieldAndTheLine) {
  ASSERT_OK_AND_ASSIGN(Json j, ParseJson("{\n\"i\": -3,\n\"s\": 1}"));
  {
    ObjectReader r(j, "model file 'm.json'");
    r.Int("i", 1);
    const absl::Status s = r.Finish();
    EXPECT_THAT(s, StatusIs(absl::StatusCode::kInvalidArgument));
    EXPECT_EQ(s.message(),
              "model file 'm.json': field 'i' (line 2): must be an integer "
              ">= 1, is -3");
  }
  {
    ObjectReader r(j, "f", "outer");
    r.OptionalInt("i", 0);
    r.String("s");
    EXPECT_EQ(r.Finish().message(),
              "f: field 'outer.s' (line 3): must be a string, is a number");
  }
  {
    ObjectReader r(j, "f");
    r.Int("i");
    r.String("missing");
    EXPECT_EQ(r.Finish().message(), "f: field 'missing': missing");
  }
  {
    ObjectReader r(j, "f");
    r.Int("i");
    EXPECT_EQ(r.Finish().message(),
              "f: field 's' (line 3): unknown field (known here: 'i')");
  }
  {
    ASSERT_OK_AND_ASSIGN(Json arr, ParseJson("[1]"));
    ObjectReader r(arr, "f");
    r.Int("i");
    EXPECT_EQ(r.Finish().message(), "f: must be a JSON object, is an array");
  }
  {
    ASSERT_OK_AND_ASSIGN(Json frac, ParseJson("{\"i\": 1.5}"));
    ObjectReader r(frac, "f");
    r.Int("i");
    EXPECT_THAT(r.Finish().message(), HasSubstr("must be an integer, is 1.5"));
  }
}

}  // namespace
}  // namespace planner
}  // namespace downpour
