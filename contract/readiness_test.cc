#include "contract/readiness.h"

#include <gtest/gtest.h>

namespace dflash {
namespace {

using Clock = Readiness::Clock;
using V = Readiness::Verdict;
const Clock::time_point t0{};  // a fake clock: no process, no waiting

Readiness Make(const char* text, Millis timeout = Millis(0)) {
  ReadySpec s;
  std::string err;
  EXPECT_TRUE(ParseReadySpec(text, &s, &err)) << err;
  s.timeout = timeout;
  Readiness r(s);
  EXPECT_TRUE(r.Init(&err)) << err;
  return r;
}

TEST(ReadinessTest, NoneIsReadyAtExecWhateverFollows) {
  Readiness r = Make("none", Millis(100));
  EXPECT_TRUE(r.OnExec(t0));
  EXPECT_EQ(r.verdict(), V::kReady);
  EXPECT_FALSE(r.deadline());
  r.OnExit(false);
  EXPECT_FALSE(r.OnExitDrained());
  EXPECT_EQ(r.verdict(), V::kReady);
}

TEST(ReadinessTest, NotifyIsReadyOnceOnReady1) {
  Readiness r = Make("notify", Millis(1000));
  EXPECT_FALSE(r.OnExec(t0));
  EXPECT_TRUE(r.waiting());
  EXPECT_FALSE(r.OnLine(0, "READY=1"));  // not this mode's evidence
  EXPECT_FALSE(r.OnFileExists());
  EXPECT_TRUE(r.OnNotifyReady());
  EXPECT_FALSE(r.OnNotifyReady());  // exactly once
  EXPECT_EQ(r.verdict(), V::kReady);
  EXPECT_FALSE(r.OnClock(t0 + Millis(5000)));  // ready: the deadline is gone
}

TEST(ReadinessTest, LogMatchesWholeLinesOfTheChosenStream) {
  Readiness r = Make("log:^compiled in [0-9]+s$", Millis(0));
  r.OnExec(t0);
  EXPECT_FALSE(r.OnLine(0, "compiling"));
  EXPECT_FALSE(r.OnLine(1, "compiled in 3s"));  // stderr: a traceback may echo the pattern
  EXPECT_FALSE(r.OnNotifyReady());
  EXPECT_TRUE(r.OnLine(0, "compiled in 3s"));
  EXPECT_FALSE(r.WantsLines());
}

TEST(ReadinessTest, ABadPatternIsRefusedBeforeAnythingRuns) {
  ReadySpec s;
  s.mode = ReadyMode::kLog;
  s.arg = "([";
  Readiness r(s);
  std::string err;
  EXPECT_FALSE(r.Init(&err));
  EXPECT_NE(err.find("bad regex '(['"), std::string::npos) << err;
}

TEST(ReadinessTest, FileIsReadyWhenTheCallerFindsIt) {
  Readiness r = Make("file:/tmp/x");
  r.OnExec(t0);
  EXPECT_TRUE(r.WantsFileCheck());
  EXPECT_TRUE(r.OnFileExists());
  EXPECT_FALSE(r.WantsFileCheck());
}

TEST(ReadinessTest, ExitIsReadyOnExit0Only) {
  Readiness ok = Make("exit", Millis(1000));
  ok.OnExec(t0);
  ok.OnExit(true);
  EXPECT_TRUE(ok.OnExitDrained());
  EXPECT_EQ(ok.verdict(), V::kReady);

  Readiness bad = Make("exit", Millis(1000));
  bad.OnExec(t0);
  bad.OnExit(false);
  EXPECT_FALSE(bad.OnExitDrained());
  EXPECT_EQ(bad.verdict(), V::kFailed);
}

TEST(ReadinessTest, EvidenceFromAProcessThatFailedDoesNotCount) {
  // The last words of a crashing payload: the line arrives with its exit 1.
  Readiness r = Make("log:^ready$", Millis(1000));
  r.OnExec(t0);
  r.OnExit(false);
  EXPECT_FALSE(r.OnLine(0, "ready"));
  EXPECT_TRUE(r.discounted_evidence());
  EXPECT_FALSE(r.OnExitDrained());
  EXPECT_EQ(r.verdict(), V::kFailed);
}

TEST(ReadinessTest, EvidenceLeftByAProcessThatEndedWellCounts) {
  Readiness r = Make("notify", Millis(1000));
  r.OnExec(t0);
  r.OnExit(true);
  EXPECT_TRUE(r.OnNotifyReady());  // queued before its exit 0, read after
  EXPECT_FALSE(r.discounted_evidence());
  EXPECT_FALSE(r.OnExitDrained());
  EXPECT_EQ(r.verdict(), V::kReady);
}

TEST(ReadinessTest, AnExitWithoutEvidenceFails) {
  Readiness r = Make("notify", Millis(1000));
  r.OnExec(t0);
  r.OnExit(true);
  EXPECT_FALSE(r.OnExitDrained());
  EXPECT_EQ(r.verdict(), V::kFailed);
  EXPECT_FALSE(r.OnClock(t0 + Millis(2000)));  // failed, not timed out
}

TEST(ReadinessTest, TheDeadlineCountsFromExecAndFiresOnce) {
  Readiness r = Make("notify", Millis(1500));
  EXPECT_FALSE(r.deadline());  // not started: nothing to time out
  r.OnExec(t0 + Millis(100));
  ASSERT_TRUE(r.deadline());
  EXPECT_EQ(*r.deadline(), t0 + Millis(1600));
  EXPECT_FALSE(r.OnClock(t0 + Millis(1599)));
  EXPECT_TRUE(r.OnClock(t0 + Millis(1600)));
  EXPECT_FALSE(r.OnClock(t0 + Millis(1700)));
  EXPECT_EQ(r.verdict(), V::kTimedOut);
  EXPECT_FALSE(r.OnNotifyReady());  // too late: it stays timed out
  EXPECT_EQ(r.TimeoutText(), "not ready after 1s500ms (ready = notify: no READY=1 received)");
}

TEST(ReadinessTest, TimeoutZeroWaitsForever) {
  Readiness r = Make("notify", Millis(0));
  r.OnExec(t0);
  EXPECT_FALSE(r.deadline());
  EXPECT_FALSE(r.OnClock(t0 + std::chrono::hours(24 * 365)));
  EXPECT_TRUE(r.waiting());
}

}  // namespace
}  // namespace dflash
