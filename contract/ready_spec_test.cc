#include "contract/ready_spec.h"

#include <gtest/gtest.h>

namespace dflash {
namespace {

TEST(ReadySpec, ParsesEveryMode) {
  ReadySpec s;
  std::string err;
  ASSERT_TRUE(ParseReadySpec("notify", &s, &err)) << err;
  EXPECT_EQ(s.mode, ReadyMode::kNotify);
  ASSERT_TRUE(ParseReadySpec("log:^compiled( in [0-9]+s)?$", &s, &err)) << err;
  EXPECT_EQ(s.mode, ReadyMode::kLog);
  EXPECT_EQ(s.arg, "^compiled( in [0-9]+s)?$");
  ASSERT_TRUE(ParseReadySpec("file:/tmp/a:b", &s, &err)) << err;
  EXPECT_EQ(s.mode, ReadyMode::kFile);
  EXPECT_EQ(s.arg, "/tmp/a:b");  // only the first ':' separates
  for (const char* t : {"none", "exit", "notify", "file:/x", "log:a|b"}) {
    ASSERT_TRUE(ParseReadySpec(t, &s, &err)) << t;
    EXPECT_EQ(FormatReadySpec(s), t);
  }
}

TEST(ReadySpec, RejectsMistakes) {
  ReadySpec s;
  std::string err;
  EXPECT_FALSE(ParseReadySpec("ready", &s, &err));
  EXPECT_NE(err.find("unknown ready mode 'ready'"), std::string::npos) << err;
  EXPECT_FALSE(ParseReadySpec("log", &s, &err));
  EXPECT_NE(err.find("'log:<regex>'"), std::string::npos) << err;
  EXPECT_FALSE(ParseReadySpec("notify:x", &s, &err));
  EXPECT_FALSE(ParseReadySpec("log:a(b", &s, &err));
  EXPECT_NE(err.find("bad regex"), std::string::npos) << err;
}

TEST(ReadySpec, DescribesWhatIsMissing) {
  ReadySpec s;
  s.mode = ReadyMode::kNotify;
  EXPECT_EQ(DescribeNotReady(s), "notify: no READY=1 received");
  s.mode = ReadyMode::kLog;
  s.arg = "compiled";
  EXPECT_EQ(DescribeNotReady(s), "log: no output line matched 'compiled'");
}

TEST(LineMatcher, ExtendedRegexOnExactBytes) {
  LineMatcher m;
  std::string err;
  ASSERT_TRUE(m.Compile("^compiled [0-9]+ graphs?$", &err)) << err;
  EXPECT_TRUE(m.Matches("compiled 3 graphs"));
  EXPECT_FALSE(m.Matches("compiled 3 graphs!"));
  // The range is exact: bytes after the view do not count.
  std::string s = "compiled 1 graphXYZ";
  EXPECT_TRUE(m.Matches(std::string_view(s).substr(0, 16)));
  // A very long line does not blow the stack (std::regex would).
  std::string big(4 << 20, 'x');
  EXPECT_FALSE(m.Matches(big));
}

}  // namespace
}  // namespace dflash
