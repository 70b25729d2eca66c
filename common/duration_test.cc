#include "common/duration.h"

#include <gtest/gtest.h>

namespace dflash {
namespace {

Millis Parse(const char* s) {
  Millis d{-1};
  std::string err;
  EXPECT_TRUE(ParseDuration(s, &d, &err)) << s << ": " << err;
  return d;
}

std::string Error(const char* s) {
  Millis d{};
  std::string err;
  EXPECT_FALSE(ParseDuration(s, &d, &err)) << s;
  return err;
}

TEST(Duration, ParsesUnitsAndCompounds) {
  EXPECT_EQ(Parse("0"), Millis(0));
  EXPECT_EQ(Parse("250ms"), Millis(250));
  EXPECT_EQ(Parse("30s"), Millis(30'000));
  EXPECT_EQ(Parse("20m"), Millis(1'200'000));
  EXPECT_EQ(Parse("1h30m"), Millis(5'400'000));
  EXPECT_EQ(Parse("2d"), Millis(172'800'000));
}

TEST(Duration, RejectsWhatPeopleGetWrong) {
  EXPECT_NE(Error("30").find("missing unit"), std::string::npos);
  EXPECT_NE(Error("5 s").find("write '5s'"), std::string::npos);
  EXPECT_NE(Error("10min").find("unknown unit 'min'"), std::string::npos);
  EXPECT_NE(Error("").find("empty"), std::string::npos);
  EXPECT_NE(Error("-5s").find("expected a number"), std::string::npos);
  EXPECT_NE(Error("99999999999999999999s").find("too large"), std::string::npos);
}

TEST(Duration, FormatsRoundTrip) {
  for (long long ms : {0LL, 1LL, 999LL, 1000LL, 90'000LL, 5'400'250LL, 90'061'001LL}) {
    Millis back{};
    std::string err;
    ASSERT_TRUE(ParseDuration(FormatDuration(Millis(ms)), &back, &err)) << err;
    EXPECT_EQ(back.count(), ms);
  }
  EXPECT_EQ(FormatDuration(Millis(90'000)), "1m30s");
}

}  // namespace
}  // namespace dflash
