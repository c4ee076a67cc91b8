#include "common/token_file.h"

#include <fstream>

#include "common/test_util.h"

namespace downpour {
namespace {

std::string Write(const std::string& name, const std::string& text) {
  const std::string path = TestTmpDir() + "/" + name;
  std::ofstream(path) << text;
  return path;
}

TEST(TokenFileTest, ReadsAndChecks) {
  ASSERT_OK_AND_ASSIGN(std::string t,
                       ReadTokenFile(Write("good", "  job-7f3a9c\n")));
  EXPECT_EQ(t, "job-7f3a9c");
  EXPECT_THAT(ReadTokenFile(TestTmpDir() + "/missing"),
              StatusIs(absl::StatusCode::kNotFound));
  EXPECT_THAT(ReadTokenFile(Write("empty", "\n")),
              StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(ReadTokenFile(Write("space", "two words")),
              StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(ReadTokenFile(Write("long", std::string(513, 'x'))),
              StatusIs(absl::StatusCode::kInvalidArgument));
  absl::Status s = ReadTokenFile(Write("binary",
                                       "zqxv\x01"
                                       "wy"))
                       .status();
  EXPECT_THAT(s, StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_EQ(std::string(s.message()).find("zqxv"), std::string::npos)
      << "the message shows the token: " << s;
}

}  // namespace
}  // namespace downpour
