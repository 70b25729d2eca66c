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

// toml++ recurses once per level: 40,000 of them overflowed the stack of `check` (SIGSEGV).
TEST(TomlGuard, RefusesNestingDeeperThanTheBoundBeforeTomlSeesIt) {
  auto dotted = [](int parts) {
    std::string k = "a";
    for (int i = 1; i < parts; ++i) k += ".a";
    return "[run]\n" + k + " = 1\n";
  };
  auto nested = [](int levels, char open, char close, const std::string& inner) {
    return "x = " + std::string(levels, open) + inner + std::string(levels, close) + "\n";
  };
  for (const std::string& t : {dotted(40000), dotted(kMaxTomlNesting + 2), nested(40000, '[', ']', "1"),
                               nested(kMaxTomlNesting + 1, '[', ']', "1"), "x = " + std::string(40000, '{'),
                               "[" + dotted(40000).substr(6) + "]\n"}) {
    int line = 0, col = 0;
    std::string msg, hint;
    EXPECT_FALSE(ScreenTomlText(t, &line, &col, &msg, &hint)) << t.substr(0, 80);
    EXPECT_NE(msg.find("nested deeper than"), std::string::npos) << msg;
    EXPECT_FALSE(hint.empty());
  }
  int line = 0, col = 0;
  std::string msg;
  ASSERT_FALSE(ScreenTomlText("[run]\nname = \"x\"\n" + dotted(40000).substr(6), &line, &col, &msg));
  EXPECT_EQ(line, 3);  // where the key goes too deep
  // What a real config uses: dotted keys, floats, dates, arrays of inline tables, dots in strings.
  for (const char* t : {"[run]\nenv.A = \"1.2.3.4.5.6.7.8\"\n", "a.b.c = 1.5\n", "t = 1979-05-27T07:32:00.999\n",
                        "[[role]]\nready = { mode = \"log\", arg = \"a.b.c\" }\nx = [[1.5, 2.5], [3.5]]\n",
                        "# a.b.c.d.e.f.g.h.i.j.k.l.m.n.o.p.q.r.s.t.u.v.w.x.y.z.a.b.c.d.e.f.g.h.i.j.k.l.m.n.o.p.q.r.s.t.u.v.w\n"})
    EXPECT_TRUE(Ok(t)) << t;
  EXPECT_TRUE(Ok(dotted(kMaxTomlNesting - 2).c_str()));
}

}  // namespace
}  // namespace dflash
