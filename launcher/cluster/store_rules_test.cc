// This node's standing in the store, its outages and its restart rounds, with a fake clock.
#include "launcher/cluster/store_rules.h"

#include <gtest/gtest.h>

namespace dflash {
namespace {

const SteadyTime kT0 = SteadyTime{} + std::chrono::hours(1);

TEST(StoreRules, AGoneRegistrationIsRecreatedOnlyOnANewConnection) {
  EXPECT_EQ(JudgeRefresh(1, false), Standing::kRegistered);
  EXPECT_EQ(JudgeRefresh(1, true), Standing::kRegistered);
  // The store restarted empty: every node finds itself gone on the connection it had to make again.
  EXPECT_EQ(JudgeRefresh(2, true), Standing::kRecreate);
  // Gone while the connection stayed up: the server lived, so the key was deleted or expired unrefreshed.
  EXPECT_EQ(JudgeRefresh(2, false), Standing::kVanished);
  EXPECT_EQ(JudgeRefresh(0, false), Standing::kReplaced);
  EXPECT_EQ(JudgeRefresh(0, true), Standing::kReplaced) << "another instance holds it: no recreate";
  EXPECT_EQ(JudgeRecreate(1), Standing::kRegistered);
  EXPECT_EQ(JudgeRecreate(0), Standing::kReplaced) << "someone registered as this node meanwhile";
}

TEST(StoreRules, AnOutageEndsTheRunOnlyOnceItLastsLongerThanAllowed) {
  StoreOutage o(Millis(30000));
  EXPECT_FALSE(o.away());
  EXPECT_FALSE(o.Back(kT0)) << "nothing to be back from";
  EXPECT_EQ(o.Failed(kT0), StoreOutage::Step::kBegan);
  EXPECT_TRUE(o.away());
  EXPECT_EQ(o.Failed(kT0 + Millis(30000)), StoreOutage::Step::kGoingOn) << "30 s is within 30 s";
  EXPECT_EQ(o.Failed(kT0 + Millis(30001)), StoreOutage::Step::kTooLong);
  std::optional<SteadyTime::duration> away = o.Back(kT0 + Millis(31000));
  ASSERT_TRUE(away);
  EXPECT_EQ(std::chrono::duration_cast<Millis>(*away), Millis(31000));
  EXPECT_FALSE(o.away());
  // The next outage is timed from its own first failure.
  EXPECT_EQ(o.Failed(kT0 + Millis(100000)), StoreOutage::Step::kBegan);
  EXPECT_EQ(o.Failed(kT0 + Millis(129000)), StoreOutage::Step::kGoingOn);
}

TEST(StoreRules, ARoundStartsOnceEveryNodeStoppedForIt) {
  RoundBarrier b(3, Millis(300000));
  EXPECT_EQ(b.Waiting(0), 0);
  EXPECT_EQ(b.Poll(0, 0, 0, {}, kT0).kind, RoundBarrier::Verdict::Kind::kNone) << "not waiting";
  EXPECT_EQ(b.Waiting(1), 1);
  EXPECT_EQ(b.Poll(1, 1, 2, {}, kT0).kind, RoundBarrier::Verdict::Kind::kNone) << "two of three stopped";
  EXPECT_EQ(b.Poll(1, 2, 3, {}, kT0).kind, RoundBarrier::Verdict::Kind::kNone)
      << "the store is at round 2 already: round 1's count is not the one to start by";
  RoundBarrier::Verdict v = b.Poll(1, 1, 3, {}, kT0 + Millis(1000));
  EXPECT_EQ(v.kind, RoundBarrier::Verdict::Kind::kStart);
  EXPECT_EQ(v.round, 1);
  EXPECT_EQ(b.started(), 1);
  EXPECT_EQ(b.Waiting(1), 0) << "started: no longer waited in";
  EXPECT_EQ(b.Poll(1, 1, 3, {}, kT0 + Millis(2000)).kind, RoundBarrier::Verdict::Kind::kNone) << "started once";
}

TEST(StoreRules, ARoundIsGivenUpWhenANodeHadFinishedOrNotAllStopInTime) {
  RoundBarrier b(2, Millis(300000));
  RoundBarrier::Verdict v = b.Poll(1, 1, 1, {1}, kT0);
  EXPECT_EQ(v.kind, RoundBarrier::Verdict::Kind::kGiveUp);
  EXPECT_EQ(v.why, "node 1 had already finished: round 1 cannot restart every node");

  RoundBarrier t(2, Millis(300000));
  EXPECT_EQ(t.Poll(1, 1, 1, {}, kT0).kind, RoundBarrier::Verdict::Kind::kNone);  // the wait begins here
  EXPECT_EQ(t.Poll(1, 1, 1, {}, kT0 + Millis(300000)).kind, RoundBarrier::Verdict::Kind::kNone);
  v = t.Poll(1, 1, 1, {}, kT0 + Millis(300001));
  EXPECT_EQ(v.kind, RoundBarrier::Verdict::Kind::kGiveUp);
  EXPECT_EQ(v.round, 1);
  EXPECT_NE(v.why.find("not every node stopped within 5m"), std::string::npos) << v.why;
}

TEST(StoreRules, EachRoundGetsItsOwnTimeout) {
  RoundBarrier b(2, Millis(10000));
  b.Poll(1, 1, 1, {}, kT0);
  ASSERT_EQ(b.Poll(1, 1, 2, {}, kT0 + Millis(9000)).kind, RoundBarrier::Verdict::Kind::kStart);
  // Round 2 begins long after round 1's wait began: timed from its own first poll.
  EXPECT_EQ(b.Poll(2, 2, 1, {}, kT0 + Millis(60000)).kind, RoundBarrier::Verdict::Kind::kNone);
  EXPECT_EQ(b.Poll(2, 2, 1, {}, kT0 + Millis(69000)).kind, RoundBarrier::Verdict::Kind::kNone);
  EXPECT_EQ(b.Poll(2, 2, 1, {}, kT0 + Millis(70001)).kind, RoundBarrier::Verdict::Kind::kGiveUp);
}

}  // namespace
}  // namespace dflash
