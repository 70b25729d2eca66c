// What the coordinator believes of the store's records: a failure of a node the run does not have, or one
// that claims success, a round that is no number, a registration that no launcher wrote, count for nothing.
#include "launcher/cluster/store_records.h"

#include <gtest/gtest.h>

namespace dflash {
namespace {

using nlohmann::json;

TEST(StoreRecords, AFailureMustNameANodeOfThisRunAndAFailure) {
  std::string why;
  EXPECT_TRUE(ValidFailureRecord({{"node", 1}, {"process", "w:0"}, {"exit_code", 3}, {"reason", "x"}}, 2, &why));
  EXPECT_TRUE(ValidFailureRecord({{"node", 0}, {"process", nullptr}, {"exit_code", nullptr}, {"reason", "lost"}}, 2,
                                 &why));
  EXPECT_FALSE(ValidFailureRecord({{"node", 9}, {"exit_code", 0}, {"reason", "x"}}, 2, &why));
  EXPECT_NE(why.find("no node of this run"), std::string::npos) << why;
  EXPECT_FALSE(ValidFailureRecord({{"node", 1}, {"exit_code", 0}, {"reason", "x"}}, 2, &why));
  EXPECT_NE(why.find("no failure"), std::string::npos) << why;
  EXPECT_FALSE(ValidFailureRecord({{"node", -1}, {"reason", "x"}}, 2, &why));
  EXPECT_FALSE(ValidFailureRecord({{"node", "1"}, {"reason", "x"}}, 2, &why));
  EXPECT_FALSE(ValidFailureRecord({{"node", 1}, {"exit_code", "3"}, {"reason", "x"}}, 2, &why));
  EXPECT_FALSE(ValidFailureRecord({{"node", 1}, {"process", 5}, {"reason", "x"}}, 2, &why));
  EXPECT_FALSE(ValidFailureRecord({{"node", 1}, {"exit_code", 3}}, 2, &why));
  EXPECT_FALSE(ValidFailureRecord(json::array({1, 2}), 2, &why));
  EXPECT_FALSE(ValidFailureRecord(json::parse("not json", nullptr, false), 2, &why));
}

TEST(StoreRecords, ARoundIsASmallStepFromTheOneSeen) {
  int round = -1;
  std::string why;
  ASSERT_TRUE(ParseRoundRecord("", 3, &round, &why));
  EXPECT_EQ(round, 0);
  ASSERT_TRUE(ParseRoundRecord("4", 3, &round, &why));
  EXPECT_EQ(round, 4);
  EXPECT_FALSE(ParseRoundRecord("-1", 3, &round, &why));
  EXPECT_FALSE(ParseRoundRecord("4x", 3, &round, &why));
  EXPECT_FALSE(ParseRoundRecord("999999999", 3, &round, &why));
  EXPECT_NE(why.find("far past"), std::string::npos) << why;
}

TEST(StoreRecords, ARegistrationHasANonceAndAHeartbeat) {
  EXPECT_TRUE(ValidRegistration("0123456789abcdef0123456789abcdef", "12"));
  EXPECT_FALSE(ValidRegistration("0123456789ABCDEF0123456789abcdef", "12"));
  EXPECT_FALSE(ValidRegistration("short", "12"));
  EXPECT_FALSE(ValidRegistration("0123456789abcdef0123456789abcdef", "x"));
  EXPECT_FALSE(ValidRegistration("0123456789abcdef0123456789abcdef", ""));
}

}  // namespace
}  // namespace dflash
