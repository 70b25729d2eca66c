#include "launcher/config/toml_guard.h"

#include <gtest/gtest.h>

namespace dflash {
namespace {

// U+01F2 is one of the code points that send toml++ 3.3 into __builtin_unreachable().
#define CP "\xc7\xb2"

bool Ok(const char* text) {
  int line = 0, col = 0;
  std::string msg;
  return ScreenTomlText(text, &line, &col, &msg);
}

TEST(TomlGuard, AcceptsNonAsciiInStringsAndComments) {
  for (const char* t : {"a = \"" CP "\"\n", "# " CP "\n", "a = \"\"\"" CP "\"\"\"\n", "a = '" CP "'\n",
                        "a = '''" CP "'''\n", "a = [\"" CP "\"]\n", "a = { b = \"" CP "\" }\n", "\"" CP "\" = 1\n",
                        "[\"" CP "\"]\nb = 1\n", "a = 1 # " CP "\n", "a = \"\\\"" CP "\"\n",
                        "a = \"\"\"x\"\"\"\"\nb = '" CP "'\n"})
    EXPECT_TRUE(Ok(t)) << t;
}

TEST(TomlGuard, RejectsWhatToml33CannotParseSafely) {
  // Each of these reached UB under UBSan in toml++ 3.3 (see toml_guard.h).
  for (const char* t : {"a = \"\"\"\\\n" CP "\"\"\"\n", "a = \"\"\"x\\\n   " CP "\"\"\"\n", "a = 1" CP "\n",
                        CP " = 1\n", "a = 1979-05-27T07:32:00" CP "\n", "a = true" CP "\n", "a = \"x\" " CP "\n",
                        "a = \"\"\"\\" CP "\"\"\"\n"})
    EXPECT_FALSE(Ok(t)) << t;
}

TEST(TomlGuard, ReportsPositionAndCodePoint) {
  int line = 0, col = 0;
  std::string msg;
  ASSERT_FALSE(ScreenTomlText("[run]\nname = \"x\" # ok " CP "\nport = 1" CP "\n", &line, &col, &msg));
  EXPECT_EQ(line, 3);
  EXPECT_EQ(col, 9);
  EXPECT_NE(msg.find("U+01F2"), std::string::npos);
  ASSERT_FALSE(ScreenTomlText("a = \"\xff\"\n", &line, &col, &msg));
  EXPECT_NE(msg.find("not valid UTF-8"), std::string::npos);
  EXPECT_EQ(col, 6);
}

}  // namespace
}  // namespace dflash
