#include "psctl/output.h"

#include <string>

#include "common/test_util.h"
#include "gtest/gtest.h"
#include "psctl/psctl.pb.h"

namespace downpour {
namespace {

TEST(OutputTest, ParsesTheFormats) {
  EXPECT_EQ(*ParseOutputFormat(""), OutputFormat::kText);
  EXPECT_EQ(*ParseOutputFormat("text"), OutputFormat::kText);
  EXPECT_EQ(*ParseOutputFormat("wide"), OutputFormat::kWide);
  EXPECT_EQ(*ParseOutputFormat("json"), OutputFormat::kJson);
  EXPECT_EQ(*ParseOutputFormat("yaml"), OutputFormat::kYaml);
  EXPECT_EQ(ParseOutputFormat("xml").status().code(),
            absl::StatusCode::kInvalidArgument);
}

// One JSON style: the .proto's snake_case names, zero values present.
TEST(OutputTest, JsonHasSnakeCaseNamesAndZeroValues) {
  psctl::JobResult r;
  r.set_kind("train");
  r.add_processes()->set_program("ps_worker");
  const std::string json = ToJson(r);
  EXPECT_NE(json.find("\"exit_status\": 0"), std::string::npos) << json;
  EXPECT_NE(json.find("\"work_dir\": \"\""), std::string::npos) << json;
  EXPECT_NE(json.find("\"interrupted\": false"), std::string::npos) << json;
  EXPECT_EQ(json.find("exitStatus"), std::string::npos) << json;
  EXPECT_EQ(json.back(), '\n');
}

TEST(OutputTest, YamlIsTheSameTreeInFieldOrder) {
  psctl::JobResult r;
  r.set_kind("train");
  psctl::JobResult::Process* p = r.add_processes();
  p->set_program("/bin/ps_worker");
  p->set_exit_status(143);
  p->set_log("a: b");
  r.add_processes()->set_program("yes");
  r.set_failed(1);
  EXPECT_EQ(ToYaml(r),
            "kind: train\n"
            "processes:\n"
            "- program: /bin/ps_worker\n"
            "  exit_status: 143\n"
            "  log: \"a: b\"\n"
            "- program: \"yes\"\n"
            "  exit_status: 0\n"
            "  log: \"\"\n"
            "failed: 1\n"
            "interrupted: false\n"
            "work_dir: \"\"\n");
}

TEST(OutputTest, YamlOfNestedAndEmptyValues) {
  ASSERT_OK_AND_ASSIGN(
      std::string yaml,
      JsonToYaml(R"({"a": {"b": [1, [2, 3], {"c": "x\ny"}], "d": {},)"
                 R"( "e": [], "f": null, "g": "1.5", "h": "\u00e9"}})"));
  EXPECT_EQ(yaml,
            "a:\n"
            "  b:\n"
            "  - 1\n"
            "  - - 2\n"
            "    - 3\n"
            "  - c: \"x\\ny\"\n"
            "  d: {}\n"
            "  e: []\n"
            "  f: null\n"
            "  g: \"1.5\"\n"
            "  h: \"\xc3\xa9\"\n");
  EXPECT_EQ(JsonToYaml("{\"a\": ").status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(JsonToYaml("[1] 2").status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace downpour
