#include "common/printable.h"

#include <gtest/gtest.h>

namespace dflash {
namespace {

TEST(Printable, EscapeSequencesBecomeText) {
  EXPECT_EQ(Printable("dflash-launch pid 1 on host h"), "dflash-launch pid 1 on host h");
  EXPECT_EQ(Printable("\x1b]0;pwned\x07\x1b[2Jx\r\n"), "\\x1b]0;pwned\\x07\\x1b[2Jx\\x0d\\x0a");
  EXPECT_EQ(Printable(std::string("a\0b", 3)), "a\\x00b");
  EXPECT_EQ(Printable("back\\slash"), "back\\\\slash");  // an escape cannot be forged
  EXPECT_EQ(Printable("\x7f"), "\\x7f");
}

TEST(Printable, Utf8StaysAndC1AndBrokenBytesDoNot) {
  EXPECT_EQ(Printable("caf\xc3\xa9 \xe2\x9c\x93 \xf0\x9f\x99\x82"), "caf\xc3\xa9 \xe2\x9c\x93 \xf0\x9f\x99\x82");
  EXPECT_EQ(Printable("\xc2\x9b" "2J"), "\\xc2\\x9b2J");  // U+009B, the 8-bit CSI
  EXPECT_EQ(Printable("\x9b" "2J"), "\\x9b2J");            // a raw C1 byte
  EXPECT_EQ(Printable("\xe2\x9c"), "\\xe2\\x9c");          // cut short
  EXPECT_EQ(Printable("\xc0\xaf"), "\\xc0\\xaf");          // overlong '/'
}

}  // namespace
}  // namespace dflash
