// SupervisorCore as a whole, with a fake clock and no processes (core_test_harness.h): the run from start to
// end, the names of states and verbs, the order of its actions, restart units (scope, torch worlds), time that
// did not pass for the run, the guardian. Its parts have their own files: process_unit_test, incident_test,
// start_order_test, node_rounds_test, control_verbs_test.
#include <gtest/gtest.h>

#include <csignal>
#include <string>
#include <vector>

#include "launcher/core/core_test_harness.h"
#include "testing/enum_names_check.h"

namespace dflash {
namespace {

using core_test::Harness;
using core_test::kOnFailure3;
using core_test::Role;

TEST(SupervisorCore, StartsEveryProcessAndRunsThem) {
  Harness h(Role("a", 2, ""));
  h.Start();
  EXPECT_EQ(h.State("a:0"), "RUNNING");
  EXPECT_EQ(h.State("a:1"), "RUNNING");
  EXPECT_FALSE(h.core().Done());
  h.Exit("a:0", 0);
  h.Exit("a:1", 0);
  EXPECT_TRUE(h.core().Done());
  EXPECT_EQ(h.core().ExitCode(), 0);
  EXPECT_EQ(h.core().ExitReason(), "all processes succeeded");
}

TEST(SupervisorCore, ScopeRoleRestartsTheRoleOnly) {
  std::string flaky = "restart = { policy = \"on-failure\", scope = \"role\", max = 3, window = \"1h\", backoff = \"1s..1s\" }";
  Harness h(Role("stable", 2, kOnFailure3) + Role("flaky", 2, flaky));
  h.Start();
  h.Exit("flaky:0", 1);
  EXPECT_EQ(h.State("flaky:1"), "STOPPING");
  EXPECT_EQ(h.TakeSignals("flaky:1"), std::vector<int>{SIGTERM});
  EXPECT_EQ(h.State("stable:0"), "RUNNING");
  h.Killed("flaky:1", SIGTERM);
  EXPECT_EQ(h.State("flaky:1"), "BACKOFF");
  h.Advance(Millis(1000));
  EXPECT_EQ(h.Spawns("flaky:0"), 2);
  EXPECT_EQ(h.Spawns("flaky:1"), 2);
  EXPECT_EQ(h.Spawns("stable:0"), 1);
  EXPECT_EQ(h.Proc("flaky:1").last() - &h.Proc("flaky:1").attempts[0], 1);
  EXPECT_EQ(std::string(AttemptOutcomeName(h.Proc("flaky:1").attempts[0].outcome)), "restarted");
}

TEST(SupervisorCore, ScopeAllRestartsEveryone) {
  std::string all = "restart = { policy = \"on-failure\", scope = \"all\", max = 3, window = \"1h\", backoff = \"1s..1s\" }";
  Harness h(Role("stable", 1, kOnFailure3) + Role("flaky", 1, all));
  h.Start();
  h.Exit("flaky:0", 1);
  EXPECT_EQ(h.State("stable:0"), "STOPPING");
  h.Exit("stable:0", 0);  // stopped for the restart: its end is no success and no failure
  EXPECT_EQ(h.State("stable:0"), "BACKOFF");
  h.Advance(Millis(1000));
  EXPECT_EQ(h.Spawns("stable:0"), 2);
  EXPECT_EQ(h.Spawns("flaky:0"), 2);
}

TEST(SupervisorCore, ATorchWorldIsOneRestartUnitWhateverTheScope) {
  Harness h(Role("target", 2, kOnFailure3) + Role("drafter", 2, kOnFailure3) + Role("other", 1, kOnFailure3),
            [](RunConfig* c) {
              c->roles[0].world = TorchWorld::kRun;
              c->roles[1].world = TorchWorld::kRun;
            });
  h.Start();
  EXPECT_EQ(h.core().RestartUnit(h.Index("drafter:1")).size(), 4u);
  h.Exit("drafter:1", 3);
  for (const char* n : {"target:0", "target:1", "drafter:0"}) EXPECT_EQ(h.State(n), "STOPPING") << n;
  EXPECT_EQ(h.State("other:0"), "RUNNING");
  for (const char* n : {"target:0", "target:1", "drafter:0"}) h.Killed(n, SIGTERM);
  h.Advance(Millis(1000));
  for (const char* n : {"target:0", "target:1", "drafter:0", "drafter:1"}) EXPECT_EQ(h.Spawns(n), 2) << n;
  EXPECT_EQ(h.Spawns("other:0"), 1);
}

TEST(SupervisorCore, EveryStateAndVerbHasOneNameThatReadsBack) {
  ExpectOneNameEachAndRoundTrip(kProcStateNames,
                                {ProcState::kNotStarted, ProcState::kWaiting, ProcState::kFailed, ProcState::kStarting,
                                 ProcState::kRunning, ProcState::kBackoff, ProcState::kStopping, ProcState::kExited,
                                 ProcState::kFatal});
  ExpectOneNameEachAndRoundTrip(kAttemptOutcomeNames,
                                {AttemptOutcome::kNone, AttemptOutcome::kRestarted, AttemptOutcome::kRestartedByCtl,
                                 AttemptOutcome::kStopped, AttemptOutcome::kStoppedByCtl, AttemptOutcome::kSucceeded,
                                 AttemptOutcome::kFailed, AttemptOutcome::kFatal, AttemptOutcome::kHung,
                                 AttemptOutcome::kCollateral});
  ExpectOneNameEachAndRoundTrip(kControlVerbNames, {ControlVerb::kStatus, ControlVerb::kRestart, ControlVerb::kStop,
                                                    ControlVerb::kStart, ControlVerb::kSignal, ControlVerb::kMetrics});
  EXPECT_STREQ(ProcStateName(ProcState::kRunning), "RUNNING");
  ControlVerb v{};
  EXPECT_TRUE(ParseControlVerb("restart", &v));
  EXPECT_EQ(v, ControlVerb::kRestart);
}

TEST(SupervisorCore, AStatusTextIsAnActionInOrderWithTheOthers) {
  Harness h(Role("a", 1, "ready = { mode = \"notify\", timeout = \"10s\" }"));
  h.Start();
  size_t before = h.Actions().size();
  NotifyFields r;
  r.status = "step 1 loss 2.5";
  r.ready = true;
  h.Report("a:0", r);
  int status_at = -1, running_at = -1;
  for (size_t k = before; k < h.Actions().size(); ++k) {
    const CoreAction& a = h.Actions()[k];
    if (a.kind == CoreAction::Kind::kStatusText && status_at < 0) status_at = static_cast<int>(k);
    if (a.kind == CoreAction::Kind::kEvent && a.event["to"] == "RUNNING") running_at = static_cast<int>(k);
    if (a.kind == CoreAction::Kind::kStatusText) {
      EXPECT_EQ(a.index, h.Index("a:0"));
      EXPECT_EQ(a.text, "step 1 loss 2.5");
    }
  }
  ASSERT_GE(status_at, 0);
  ASSERT_GE(running_at, 0);
  EXPECT_LT(status_at, running_at) << "it came in the datagram before READY=1 was judged";
  EXPECT_EQ(h.Said("step 1 loss"), 0) << "not a log line too: the shell logs it, once";
}

TEST(SupervisorCore, EveryTransitionIsAnEvent) {
  Harness h(Role("a", 1, kOnFailure3));
  h.Start();
  h.Exit("a:0", 4);
  std::vector<nlohmann::json> ev = h.Events();
  ASSERT_GE(ev.size(), 3u);
  EXPECT_EQ(ev[0]["from"], "NOT_STARTED");
  EXPECT_EQ(ev[0]["to"], "STARTING");
  EXPECT_EQ(ev[1]["to"], "RUNNING");
  EXPECT_EQ(ev[2]["from"], "RUNNING");
  EXPECT_EQ(ev[2]["to"], "BACKOFF");
  EXPECT_EQ(ev[2]["exit_code"], 4);
  EXPECT_EQ(ev[2]["attempt"], 0);
  EXPECT_EQ(ev[2]["manual"], false);
  EXPECT_EQ(ev[2]["process"], "a:0");
}

// --- time that did not pass for the run (issue #21, item 4) ---

NotifyFields Ping() {
  NotifyFields ping;
  ping.watchdog = true;
  return ping;
}

TEST(SupervisorCorePause, WhileAWatchdogIsTimedTheLoopLooksAtTheClockOften) {
  Harness h(Role("a", 1, ""), [](RunConfig* c) { c->roles[0].watchdog = Millis(3000); });
  h.Start();
  h.Report("a:0", Ping());
  EXPECT_EQ(h.core().NextDeadline(), h.now() + Millis(3000));
  EXPECT_EQ(h.core().NextWake(h.now()), h.now() + kPauseProbe);
  Harness idle(Role("a", 1, ""));
  idle.Start();
  EXPECT_EQ(idle.core().NextWake(idle.now()), SteadyTime::max()) << "nothing timed: no wake-ups";
}

TEST(SupervisorCorePause, AStoppedSupervisorJudgesNoWatchdogAndStillCatchesARealHang) {
  Harness h(Role("a", 1, kOnFailure3), [](RunConfig* c) { c->roles[0].watchdog = Millis(3000); });
  h.Start();
  h.Report("a:0", Ping());
  h.Turn(Millis(200));
  h.Paused(Millis(5000));  // SIGSTOP/SIGCONT of the supervisor (or of the whole run)
  EXPECT_TRUE(h.TakeSignals("a:0").empty()) << "5 s it did not see are no silence of the payload";
  EXPECT_EQ(h.State("a:0"), "RUNNING");
  EXPECT_EQ(h.core().pauses(), 1);
  EXPECT_NEAR(h.core().paused_s(), 4.75, 0.01) << "woke 4.75 s later than the 250 ms it asked for";
  // No ping since: a full interval from the resume, then hung like any other.
  for (int k = 0; k < 11; ++k) h.Turn(Millis(250));
  EXPECT_TRUE(h.TakeSignals("a:0").empty());
  h.Turn(Millis(250));
  EXPECT_EQ(h.TakeSignals("a:0"), std::vector<int>{SIGABRT});
  EXPECT_EQ(h.State("a:0"), "STOPPING");
  EXPECT_EQ(h.Proc("a:0").why.rfind("hung: no WATCHDOG=1 for 3s", 0), 0u) << h.Proc("a:0").why;
}

TEST(SupervisorCorePause, WithoutThePauseTheSameSilenceIsAHang) {
  // The control: the same 5 s seen by a supervisor that ran (no OnLoopTurn gap).
  Harness h(Role("a", 1, kOnFailure3), [](RunConfig* c) { c->roles[0].watchdog = Millis(3000); });
  h.Start();
  h.Report("a:0", Ping());
  for (int k = 0; k < 20; ++k) h.Turn(Millis(250));  // 5 s: SIGABRT at 3 s, SIGKILL after its 2 s grace
  EXPECT_EQ(h.TakeSignals("a:0"), (std::vector<int>{SIGABRT, SIGKILL}));
  EXPECT_EQ(h.core().pauses(), 0);
}

TEST(SupervisorCorePause, SchedulingNoiseIsNoPause) {
  Harness h(Role("a", 1, ""), [](RunConfig* c) { c->roles[0].watchdog = Millis(3000); });
  h.Start();
  h.Report("a:0", Ping());
  h.Paused(kPauseProbe + kPauseSlack);  // exactly the slack late
  EXPECT_EQ(h.core().pauses(), 0);
  for (int k = 0; k < 9; ++k) h.Turn(Millis(250));
  EXPECT_EQ(h.TakeSignals("a:0"), std::vector<int>{SIGABRT}) << "3 s without a ping, 750 ms of it late: hung";
}

TEST(SupervisorCorePause, ALongTurnOfWorkIsAPauseToo) {
  // Stopped while it worked (not while it waited): the next wait begins late.
  Harness h(Role("a", 1, ""), [](RunConfig* c) { c->roles[0].watchdog = Millis(3000); });
  h.Start();
  h.Report("a:0", Ping());
  h.Turn(Millis(250));
  SteadyTime woke = h.now();
  SteadyTime later = woke + Millis(5000);
  h.core().OnLoopTurn(later, later + Millis(250), later + Millis(250));
  EXPECT_EQ(h.core().pauses(), 1);
  EXPECT_NEAR(h.core().paused_s(), 5.0, 0.01);
}

TEST(SupervisorCorePause, AReadinessTimeoutIsPostponedByThePause) {
  Harness h(Role("a", 1, "ready = { mode = \"notify\", timeout = \"8s\" }"));
  h.Start();
  for (int k = 0; k < 6; ++k) h.Turn(Millis(250));  // 1.5 s
  h.Paused(Millis(10000));                           // stopped 1.5 s .. 11.5 s
  EXPECT_EQ(h.State("a:0"), "STARTING") << "8 s of its own time have not passed";
  EXPECT_FALSE(h.core().stopping());
  NotifyFields ready;
  ready.ready = true;
  h.Report("a:0", ready);  // the READY=1 it sent at 3 s, read after the resume
  EXPECT_EQ(h.State("a:0"), "RUNNING");
}

TEST(SupervisorCorePause, APostponedReadinessStillTimesOut) {
  Harness h(Role("a", 1, "ready = { mode = \"notify\", timeout = \"8s\" }"));
  h.Start();
  h.Paused(Millis(10250));  // 10 s lost: the deadline moves from 8 s to 18 s
  for (int k = 0; k < 30; ++k) h.Turn(Millis(250));  // 17.75 s
  EXPECT_FALSE(h.core().stopping());
  h.Turn(Millis(250));
  EXPECT_TRUE(h.core().stopping());
  h.Killed("a:0", SIGTERM);
  EXPECT_EQ(h.core().ExitCode(), 75);
}

TEST(SupervisorCorePause, AStopGraceIsGivenAgain) {
  Harness h(Role("a", 1, kOnFailure3));  // grace 2 s
  h.Start();
  ASSERT_TRUE(h.Ctl(ControlVerb::kStop, "a:0").ok);
  EXPECT_EQ(h.TakeSignals("a:0"), std::vector<int>{SIGTERM});
  h.Turn(Millis(250));
  h.Paused(Millis(5000));
  EXPECT_TRUE(h.TakeSignals("a:0").empty()) << "no SIGKILL: it had 500 ms of its 2 s grace";
  for (int k = 0; k < 5; ++k) h.Turn(Millis(250));
  EXPECT_TRUE(h.TakeSignals("a:0").empty());
  h.Turn(Millis(250));
  EXPECT_EQ(h.TakeSignals("a:0"), std::vector<int>{SIGKILL});
}

// --- the guardian is not optional (issue #21, item 6) ---

TEST(SupervisorCoreGuardian, ItIsStartedAgainUntilItDiesTooOften) {
  Harness h(Role("a", 1, ""));
  h.Start();
  EXPECT_TRUE(h.core().OnGuardianDied("(pid 9) was killed by SIGKILL"));
  h.Advance(Millis(10000));
  EXPECT_TRUE(h.core().OnGuardianDied("(pid 10) was killed by SIGKILL"));
  h.Advance(Millis(10000));
  EXPECT_TRUE(h.core().OnGuardianDied("(pid 11) was killed by SIGKILL"));
  h.Advance(Millis(45000));  // the first is out of the 1 min window
  EXPECT_TRUE(h.core().OnGuardianDied("(pid 12) was killed by SIGKILL"));
  h.Pump();
  EXPECT_FALSE(h.core().stopping());
  h.Advance(Millis(1000));
  EXPECT_FALSE(h.core().OnGuardianDied("(pid 13) was killed by SIGKILL"));
  h.Pump();
  EXPECT_TRUE(h.core().stopping());
  EXPECT_TRUE(h.core().unguarded());
  h.Killed("a:0", SIGTERM);
  EXPECT_TRUE(h.core().Done());
  EXPECT_EQ(h.core().ExitCode(), 1);
  EXPECT_NE(h.core().ExitReason().find("dflash-guardian (pid 13)"), std::string::npos) << h.core().ExitReason();
  EXPECT_NE(h.core().ExitReason().find("4 times within 1m"), std::string::npos) << h.core().ExitReason();
}

TEST(SupervisorCoreGuardian, NoNewGuardianStopsTheRun) {
  Harness h(Role("a", 1, ""));
  h.Start();
  h.core().StopUnguarded("dflash-guardian (pid 9) was killed by SIGKILL and a new one cannot be started (fork: no)");
  h.Pump();
  EXPECT_EQ(h.State("a:0"), "STOPPING");
  h.Killed("a:0", SIGTERM);
  EXPECT_EQ(h.core().ExitCode(), 1);
  EXPECT_NE(h.core().ExitReason().find("cannot be started"), std::string::npos);
}

TEST(SupervisorCore, OneEventIsJudgedAtOneInstant) {
  Harness h(Role("a", 3, "restart = { policy = \"on-failure\", scope = \"role\", max = 3, window = \"1h\", "
                         "backoff = \"1s..1s\" }\nstop = { grace = \"5s\" }"));
  h.Start();
  size_t before = h.Events().size();
  h.tick_per_read_ = true;  // every read of the clock moves it on
  h.Exit("a:0", 1);
  std::vector<nlohmann::json> ev = h.Events();
  ASSERT_EQ(ev.size(), before + 3) << "a:0 BACKOFF, a:1 and a:2 STOPPING";
  for (size_t k = before; k < ev.size(); ++k) EXPECT_EQ(ev[k]["t"], ev[before]["t"]) << ev[k].dump();
  EXPECT_EQ(h.Proc("a:1").restart_at, h.Proc("a:0").restart_at);
  EXPECT_EQ(h.Proc("a:1").kill_at, h.Proc("a:2").kill_at);
}

}  // namespace
}  // namespace dflash
