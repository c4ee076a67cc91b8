#include "common/json_text.h"

#include <string>

#include "gtest/gtest.h"

namespace downpour {
namespace {

std::string Quoted(absl::string_view s) {
  std::string out = "x";
  AppendJsonString(s, &out);
  return out;
}

TEST(JsonTextTest, StringsAreEscaped) {
  EXPECT_EQ(Quoted(""), "x\"\"");
  EXPECT_EQ(Quoted("plain"), "x\"plain\"");
  EXPECT_EQ(Quoted("a\"b\\c"), "x\"a\\\"b\\\\c\"");
  EXPECT_EQ(Quoted("\n\r\t"), "x\"\\n\\r\\t\"");
  EXPECT_EQ(Quoted(std::string("\x01\x1f", 2)), "x\"\\u0001\\u001f\"");
  EXPECT_EQ(Quoted(std::string("\0", 1)), "x\"\\u0000\"");
  // UTF-8 passes through.
  EXPECT_EQ(Quoted("caf\xc3\xa9"), "x\"caf\xc3\xa9\"");
}

TEST(JsonTextTest, Utf8OfCodeUnits) {
  std::string out;
  AppendUtf8(0x41, &out);
  AppendUtf8(0xe9, &out);
  AppendUtf8(0x20ac, &out);
  AppendUtf8(0x7f, &out);
  AppendUtf8(0x80, &out);
  AppendUtf8(0x7ff, &out);
  AppendUtf8(0x800, &out);
  AppendUtf8(0xffff, &out);
  EXPECT_EQ(out,
            "A\xc3\xa9\xe2\x82\xac\x7f\xc2\x80\xdf\xbf\xe0\xa0\x80\xef\xbf"
            "\xbf");
}

}  // namespace
}  // namespace downpour
