#include "launcher/core/restart_policy.h"

#include <gtest/gtest.h>

namespace dflash {
namespace {

using std::chrono::minutes;
using std::chrono::seconds;
using Kind = RestartDecision::Kind;

RestartSpec Spec(RestartPolicy p = RestartPolicy::kOnFailure) {
  RestartSpec s;
  s.policy = p;
  s.max = 3;
  s.window = minutes(30);
  s.backoff_min = seconds(5);
  s.backoff_max = seconds(40);
  s.reset_after = minutes(10);
  return s;
}

TEST(RestartTracker, BackoffDoublesAndCaps) {
  RestartSpec s = Spec();
  s.max = 10;
  s.window = minutes(5);
  RestartTracker t(s);
  SteadyTime now{};
  std::vector<long> delays;
  for (int i = 0; i < 6; ++i) {
    RestartDecision d = t.OnExit(1, seconds(1), now);
    ASSERT_EQ(d.kind, Kind::kRestart) << d.reason;
    delays.push_back(std::chrono::duration_cast<seconds>(d.delay).count());
    now += minutes(2);  // restarts spaced out so the window keeps only two
  }
  EXPECT_EQ(delays, (std::vector<long>{5, 10, 20, 40, 40, 40}));
}

TEST(RestartTracker, BudgetOfThreeInWindowMakesTheFourthFatal) {
  RestartTracker t(Spec());
  SteadyTime now{};
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(t.OnExit(1, seconds(1), now).kind, Kind::kRestart);
    now += seconds(30);
  }
  RestartDecision d = t.OnExit(1, seconds(1), now);
  EXPECT_EQ(d.kind, Kind::kExhausted);
  EXPECT_NE(d.reason.find("3 restarts within 30m (max 3)"), std::string::npos) << d.reason;
}

TEST(RestartTracker, OldRestartsLeaveTheWindow) {
  RestartTracker t(Spec());
  SteadyTime now{};
  for (int i = 0; i < 3; ++i) EXPECT_EQ(t.OnExit(1, seconds(1), now).kind, Kind::kRestart);
  now += minutes(31);  // all three are older than the window now
  EXPECT_EQ(t.OnExit(1, seconds(1), now).kind, Kind::kRestart);
  EXPECT_EQ(t.restarts(), 4);
}

TEST(RestartTracker, StableRunResetsTheBackoff) {
  RestartSpec s = Spec();
  s.max = 10;
  RestartTracker t(s);
  SteadyTime now{};
  EXPECT_EQ(t.OnExit(1, seconds(1), now).delay, seconds(5));
  EXPECT_EQ(t.OnExit(1, seconds(1), now).delay, seconds(10));
  EXPECT_EQ(t.OnExit(1, seconds(1), now).delay, seconds(20));
  // It then ran for 10 minutes before failing again: a fresh start, not 40 s.
  EXPECT_EQ(t.OnExit(1, minutes(10), now).delay, seconds(5));
  EXPECT_EQ(t.OnExit(1, seconds(1), now).delay, seconds(10));
}

TEST(RestartTracker, PoliciesAndNoRestartCodes) {
  RestartTracker never(Spec(RestartPolicy::kNever));
  EXPECT_EQ(never.OnExit(1, seconds(1), {}).kind, Kind::kNoRestart);
  RestartTracker on_failure(Spec());
  EXPECT_EQ(on_failure.OnExit(0, seconds(1), {}).kind, Kind::kNoRestart);
  EXPECT_EQ(on_failure.OnExit(137, seconds(1), {}).kind, Kind::kRestart);  // SIGKILL is a failure
  RestartTracker always(Spec(RestartPolicy::kAlways));
  EXPECT_EQ(always.OnExit(0, seconds(1), {}).kind, Kind::kRestart);
  RestartSpec s = Spec();
  s.no_restart_exit_codes = {2};
  RestartTracker coded(s);
  RestartDecision d = coded.OnExit(2, seconds(1), {});
  EXPECT_EQ(d.kind, Kind::kNoRestart);
  EXPECT_NE(d.reason.find("no_restart_exit_codes"), std::string::npos);
  EXPECT_EQ(coded.OnExit(3, seconds(1), {}).kind, Kind::kRestart);
}

TEST(RestartTracker, AFrameContractViolationIsNeverRestarted) {
  // 65 without being listed: the same frame, or the producer's same shapes, come back after a restart.
  RestartTracker always(Spec(RestartPolicy::kAlways));
  RestartDecision d = always.OnExit(65, seconds(1), {});
  EXPECT_EQ(d.kind, Kind::kNoRestart);
  EXPECT_NE(d.reason.find("[model] contract"), std::string::npos);
  EXPECT_EQ(always.OnExit(64, seconds(1), {}).kind, Kind::kRestart);
}

TEST(GuardianRestarts, AGuardianIsReplacedUntilItDiesMoreThanThreeTimesInAMinute) {
  GuardianRestarts g;
  SteadyTime now{};
  for (int k = 0; k < GuardianRestarts::kMax; ++k) {
    EXPECT_TRUE(g.OnDeath(now)) << k;
    now += seconds(10);
  }
  EXPECT_FALSE(g.OnDeath(now)) << "a fourth death within a minute";
  EXPECT_EQ(g.deaths(), 4);
}

TEST(GuardianRestarts, DeathsOlderThanTheWindowAreForgotten) {
  GuardianRestarts g;
  SteadyTime now{};
  for (int k = 0; k < 3; ++k) EXPECT_TRUE(g.OnDeath(now));
  now += seconds(61);
  EXPECT_TRUE(g.OnDeath(now)) << "the three before are more than a minute old";
  EXPECT_EQ(g.deaths(), 1);
  now += seconds(60);  // exactly the window: still counted
  EXPECT_TRUE(g.OnDeath(now));
  EXPECT_EQ(g.deaths(), 2);
}

}  // namespace
}  // namespace dflash
