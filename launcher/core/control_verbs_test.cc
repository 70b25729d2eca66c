// ControlVerbs through the core (core_test_harness.h): ctl restart, stop, start, signal and status, by hand.
#include <gtest/gtest.h>

#include <csignal>
#include <map>
#include <string>
#include <vector>

#include "launcher/core/core_test_harness.h"

namespace dflash {
namespace {

using core_test::Harness;
using core_test::kOnFailure3;
using core_test::Role;

// --- live control ---

TEST(SupervisorCoreControl, ARestartByHandDoesNotCountAgainstTheBudget) {
  Harness h(Role("a", 2, "restart = { policy = \"on-failure\", max = 1, window = \"1h\", backoff = \"1s..1s\" }"));
  h.Start();
  for (int k = 0; k < 3; ++k) {
    ControlReply r = h.Ctl(ControlVerb::kRestart, "a:1");
    ASSERT_TRUE(r.ok) << r.error;
    EXPECT_EQ(r.body["affected"], nlohmann::json::array({"a:1"}));
    EXPECT_EQ(h.TakeSignals("a:1"), std::vector<int>{SIGTERM});
    h.Killed("a:1", SIGTERM);
    h.Advance(Millis(0));  // by hand: no backoff
    EXPECT_EQ(h.State("a:1"), "RUNNING");
  }
  EXPECT_EQ(h.Spawns("a:1"), 4);
  EXPECT_EQ(h.Spawns("a:0"), 1) << "its peer kept running";
  EXPECT_EQ(h.Restarts("a:1").ctl, 3);
  EXPECT_EQ(h.Restarts("a:1").own, 0);
  EXPECT_EQ(std::string(AttemptOutcomeName(h.Proc("a:1").attempts[0].outcome)), "restarted by ctl");
  // The budget of one is intact: a real failure is still restarted.
  h.Exit("a:1", 1);
  EXPECT_EQ(h.State("a:1"), "BACKOFF");
  EXPECT_FALSE(h.core().stopping());
}

TEST(SupervisorCoreControl, AProcessStoppedByHandStaysStoppedAndTheRunStaysUp) {
  Harness h(Role("a", 2, kOnFailure3));
  h.Start();
  ASSERT_TRUE(h.Ctl(ControlVerb::kStop, "a:1").ok);
  EXPECT_EQ(h.TakeSignals("a:1"), std::vector<int>{SIGTERM});
  h.Killed("a:1", SIGTERM);
  EXPECT_EQ(h.State("a:1"), "EXITED");
  EXPECT_TRUE(h.Proc("a:1").held);
  h.Advance(Millis(60000));
  EXPECT_EQ(h.Spawns("a:1"), 1) << "not restarted";
  h.Exit("a:0", 0);
  EXPECT_FALSE(h.core().Done()) << "held: the run stays up";
  EXPECT_TRUE(h.core().Status().processes[1].held);
  ASSERT_TRUE(h.Ctl(ControlVerb::kStart, "a:1").ok);
  EXPECT_EQ(h.Spawns("a:1"), 2);
  EXPECT_EQ(h.State("a:1"), "RUNNING");
  EXPECT_FALSE(h.Proc("a:1").held);
  ASSERT_TRUE(h.Ctl(ControlVerb::kStop, "all").ok);
  h.Killed("a:1", SIGTERM);
  EXPECT_TRUE(h.core().Done());
  EXPECT_EQ(h.core().ExitCode(), 0) << h.core().ExitReason();
}

TEST(ControlVerbs, WithOnlyProcessesHeldByCtlLeftTheRunSaysSoOnceEachTime) {
  Harness h(Role("a", 2, kOnFailure3));
  h.Start();
  const std::string only_held = "nothing is running: what is left was stopped by ctl and is held";
  ASSERT_TRUE(h.Ctl(ControlVerb::kStop, "a:1").ok);
  h.Killed("a:1", SIGTERM);
  EXPECT_EQ(h.Said(only_held), 0) << "a:0 still runs";
  h.Exit("a:0", 0);
  EXPECT_EQ(h.Said(only_held), 1);
  h.Advance(Millis(60000));
  EXPECT_EQ(h.Said(only_held), 1) << "once, not on every turn";
  ASSERT_TRUE(h.Ctl(ControlVerb::kStart, "a:1").ok);
  ASSERT_TRUE(h.Ctl(ControlVerb::kStop, "a:1").ok);
  h.Killed("a:1", SIGTERM);
  EXPECT_EQ(h.Said(only_held), 2) << "said again after something ran again";
  ASSERT_TRUE(h.Ctl(ControlVerb::kStop, "all").ok);
  EXPECT_EQ(h.Said(only_held), 2) << "the run is stopping: nothing to explain";
  EXPECT_TRUE(h.core().Done());
}

TEST(SupervisorCoreControl, StartOrRestartWhileStillStoppingBringsItBack) {
  Harness h(Role("a", 2, kOnFailure3));
  h.Start();
  ASSERT_TRUE(h.Ctl(ControlVerb::kStop, "a:1").ok);
  EXPECT_EQ(h.State("a:1"), "STOPPING");
  ASSERT_TRUE(h.Ctl(ControlVerb::kStart, "a:1").ok);  // before it has ended
  h.Killed("a:1", SIGTERM);
  h.Advance(Millis(0));
  EXPECT_EQ(h.State("a:1"), "RUNNING");
  EXPECT_EQ(h.Spawns("a:1"), 2);
  EXPECT_FALSE(h.Proc("a:1").held);
  ASSERT_TRUE(h.Ctl(ControlVerb::kStop, "a:1").ok);
  ASSERT_TRUE(h.Ctl(ControlVerb::kRestart, "a:1").ok);
  h.Killed("a:1", SIGTERM);
  h.Advance(Millis(0));
  EXPECT_EQ(h.State("a:1"), "RUNNING");
  EXPECT_EQ(h.Spawns("a:1"), 3);
  EXPECT_EQ(h.Restarts("a:1").own, 0);
}

TEST(SupervisorCoreControl, RestartOfAWorldMemberRestartsItsWorld) {
  Harness h(Role("target", 2, kOnFailure3) + Role("drafter", 3, kOnFailure3),
            [](RunConfig* c) { c->roles[1].world = TorchWorld::kRole; });
  h.Start();
  ControlReply r = h.Ctl(ControlVerb::kRestart, "drafter:1");
  ASSERT_TRUE(r.ok);
  EXPECT_EQ(r.body["affected"].size(), 3u);
  for (const char* n : {"drafter:0", "drafter:1", "drafter:2"}) h.Killed(n, SIGTERM);
  h.Advance(Millis(0));
  for (const char* n : {"drafter:0", "drafter:1", "drafter:2"}) EXPECT_EQ(h.Spawns(n), 2) << n;
  for (const char* n : {"target:0", "target:1"}) EXPECT_EQ(h.Spawns(n), 1) << n;
}

// Issue #55 item 6: one rank's stop is its world's stop, asked by hand, never a failure.
Harness WorldOfThree() {
  return Harness(Role("target", 1, kOnFailure3) +
                     Role("drafter", 3,
                          "restart = { policy = \"on-failure\", scope = \"role\", max = 3, window = \"1h\", "
                          "backoff = \"1s..1s\" }"),
                 [](RunConfig* c) { c->roles[1].world = TorchWorld::kRole; });
}

TEST(SupervisorCoreControl, StopOfOneRankStopsItsWorldAndStartBringsItBack) {
  Harness h = WorldOfThree();
  h.Start();
  ControlReply r = h.Ctl(ControlVerb::kStop, "drafter:1");
  ASSERT_TRUE(r.ok) << r.error;
  EXPECT_EQ(r.body["affected"], nlohmann::json::array({"drafter:0", "drafter:1", "drafter:2"}));
  for (const char* n : {"drafter:0", "drafter:1", "drafter:2"}) {
    EXPECT_EQ(h.TakeSignals(n), std::vector<int>{SIGTERM}) << n;
    h.Killed(n, SIGTERM);
  }
  h.Advance(Millis(60000));
  for (const char* n : {"drafter:0", "drafter:1", "drafter:2"}) {
    EXPECT_EQ(h.State(n), "EXITED") << n;
    EXPECT_TRUE(h.Proc(n).held) << n << ": rank 0 would wait for a rank held by hand";
    EXPECT_EQ(h.Spawns(n), 1) << n;
    EXPECT_EQ(std::string(AttemptOutcomeName(h.Proc(n).attempts[0].outcome)), "stopped by ctl") << n;
  }
  EXPECT_EQ(h.State("target:0"), "RUNNING") << "not of the world";
  ASSERT_TRUE(h.Ctl(ControlVerb::kStart, "drafter:2").ok);
  for (const char* n : {"drafter:0", "drafter:1", "drafter:2"}) {
    EXPECT_EQ(h.Spawns(n), 2) << n << ": a rank starts with its world";
    EXPECT_FALSE(h.Proc(n).held) << n;
    EXPECT_EQ(h.Restarts(n).own, 0) << n;
  }
  ASSERT_TRUE(h.Ctl(ControlVerb::kStop, "all").ok);
  for (const char* n : {"target:0", "drafter:0", "drafter:1", "drafter:2"}) h.Killed(n, SIGTERM);
  EXPECT_TRUE(h.core().Done());
  EXPECT_EQ(h.core().ExitCode(), 0) << h.core().ExitReason();
  EXPECT_EQ(h.core().culprit(), -1);
}

TEST(SupervisorCoreControl, AStopSignalSentByHandToOneRankIsItsWorldsStopWhoeverEndsFirst) {
  for (const char* first : {"drafter:1", "drafter:0"}) {
    Harness h = WorldOfThree();
    h.Start();
    ASSERT_TRUE(h.Ctl(ControlVerb::kSignal, "drafter:1", SIGTERM).ok);
    EXPECT_EQ(h.TakeSignals("drafter:0"), std::vector<int>{}) << "ctl signal reaches its target only";
    // The world agreed on drafter:1's SIGTERM: every rank ends by it, the ones that got none too (exit 143 here).
    if (std::string(first) == "drafter:0") h.Exit("drafter:0", 128 + SIGTERM);
    else h.Killed("drafter:1", SIGTERM);
    for (const char* n : {"drafter:0", "drafter:2"})
      if (n != std::string(first)) EXPECT_EQ(h.TakeSignals(n), std::vector<int>{SIGTERM}) << first << " " << n;
    for (const char* n : {"drafter:0", "drafter:1", "drafter:2"})
      if (n != std::string(first)) h.Killed(n, SIGTERM);
    h.Advance(Millis(60000));
    for (const char* n : {"drafter:0", "drafter:1", "drafter:2"}) {
      EXPECT_EQ(h.State(n), "EXITED") << first << " " << n;
      EXPECT_TRUE(h.Proc(n).held) << first << " " << n;
      EXPECT_EQ(h.Spawns(n), 1) << first << " " << n;
      EXPECT_EQ(h.Restarts(n).own, 0) << first << " " << n;
      EXPECT_EQ(std::string(AttemptOutcomeName(h.Proc(n).attempts[0].outcome)), "stopped by ctl") << first << n;
    }
    EXPECT_FALSE(h.core().stopping());
    // Said once per rank: the first one's EXITED, the others' STOPPING.
    EXPECT_EQ(h.Said("SIGTERM sent to drafter:1 by ctl; its torch world stops with it"), 3) << first;
    ASSERT_TRUE(h.Ctl(ControlVerb::kStop, "all").ok);
    h.Killed("target:0", SIGTERM);
    EXPECT_TRUE(h.core().Done());
    EXPECT_EQ(h.core().ExitCode(), 0) << h.core().ExitReason();
    EXPECT_EQ(h.core().culprit(), -1);
  }
}

TEST(SupervisorCoreControl, OnlyAStopSignalSentByHandIsAStop) {
  {  // a kill by hand is a failure, as a kill from anywhere: its world restarts by policy
    Harness h = WorldOfThree();
    h.Start();
    ASSERT_TRUE(h.Ctl(ControlVerb::kSignal, "drafter:1", SIGKILL).ok);
    h.Killed("drafter:1", SIGKILL);
    EXPECT_EQ(h.State("drafter:1"), "BACKOFF");
    EXPECT_EQ(h.Restarts("drafter:1").own, 1);
    EXPECT_FALSE(h.Proc("drafter:1").held);
  }
  {  // SIGTERM from elsewhere (no ctl): a failure, as before
    Harness h = WorldOfThree();
    h.Start();
    h.Killed("drafter:1", SIGTERM);
    EXPECT_EQ(h.State("drafter:1"), "BACKOFF");
    EXPECT_EQ(h.Restarts("drafter:1").own, 1);
  }
  {  // ctl sent SIGTERM, but the process failed otherwise: its failure
    Harness h = WorldOfThree();
    h.Start();
    ASSERT_TRUE(h.Ctl(ControlVerb::kSignal, "drafter:1", SIGTERM).ok);
    h.Exit("drafter:0", 1);
    EXPECT_EQ(h.State("drafter:0"), "BACKOFF");
    EXPECT_EQ(h.Restarts("drafter:0").own, 1);
  }
  {  // a stop signal by hand to a process of no world: stopped by hand, alone
    Harness h(Role("a", 2, kOnFailure3));
    h.Start();
    ASSERT_TRUE(h.Ctl(ControlVerb::kSignal, "a:1", SIGTERM).ok);
    h.Killed("a:1", SIGTERM);
    EXPECT_EQ(h.State("a:1"), "EXITED");
    EXPECT_TRUE(h.Proc("a:1").held);
    EXPECT_EQ(h.Restarts("a:1").own, 0);
    EXPECT_EQ(h.State("a:0"), "RUNNING");
    EXPECT_EQ(h.TakeSignals("a:0"), std::vector<int>{});
  }
}

// One meaning of "restarts" (issue #59): a 3-rank world whose rank 1 failed once says 1/1/1 in `ctl status`, each
// with why -- its own failure, its unit's restart -- while they wait in BACKOFF and once they run again; a stop by
// hand and `ctl start` after it count as ctl.
TEST(SupervisorCoreControl, StatusCountsEveryRestartWithItsReason) {
  Harness h = WorldOfThree();
  h.Start();
  h.Exit("drafter:1", 3);
  for (const char* n : {"drafter:0", "drafter:2"}) h.Killed(n, SIGTERM);
  auto by_name = [&] {
    std::map<std::string, ProcessStatus> m;
    for (const ProcessStatus& p : h.core().Status().processes) m[p.name] = p;
    return m;
  };
  auto counts = [](const ProcessStatus& p) {
    return std::vector<int>{p.restarts.own, p.restarts.unit, p.restarts.ctl};
  };
  std::map<std::string, ProcessStatus> s = by_name();
  EXPECT_EQ(s["drafter:1"].state, "BACKOFF");
  EXPECT_EQ(counts(s["drafter:1"]), (std::vector<int>{1, 0, 0}));
  EXPECT_EQ(counts(s["drafter:0"]), (std::vector<int>{0, 1, 0}));
  EXPECT_EQ(counts(s["drafter:2"]), (std::vector<int>{0, 1, 0}));
  EXPECT_EQ(counts(s["target:0"]), (std::vector<int>{0, 0, 0}));
  EXPECT_EQ(s["drafter:0"].restarts.Text(), "1 unit");
  h.Advance(std::chrono::seconds(2));
  s = by_name();
  for (const char* n : {"drafter:0", "drafter:1", "drafter:2"}) {
    EXPECT_EQ(s[n].state, "RUNNING") << n;
    EXPECT_EQ(s[n].attempt, 1) << n;
    EXPECT_EQ(s[n].restarts.total(), 1) << n;  // what the summary says: one per attempt after the first
  }
  EXPECT_EQ(s["drafter:1"].restarts.Text(), "1 own");
  ASSERT_TRUE(h.Ctl(ControlVerb::kStop, "drafter:1").ok);
  for (const char* n : {"drafter:0", "drafter:1", "drafter:2"}) h.Killed(n, SIGTERM);
  ASSERT_TRUE(h.Ctl(ControlVerb::kStart, "drafter:1").ok);
  s = by_name();
  EXPECT_EQ(counts(s["drafter:1"]), (std::vector<int>{1, 0, 1}));
  EXPECT_EQ(counts(s["drafter:0"]), (std::vector<int>{0, 1, 1}));
  EXPECT_EQ(s["drafter:1"].restarts.Text(), "2 (1 own, 1 ctl)");
}

TEST(SupervisorCoreControl, BadTargetsAndSignals) {
  Harness h(Role("a", 2, ""));
  h.Start();
  ControlReply r = h.Ctl(ControlVerb::kRestart, "a:7");
  EXPECT_FALSE(r.ok);
  EXPECT_NE(r.error.find("a has ranks 0, 1"), std::string::npos) << r.error;
  r = h.Ctl(ControlVerb::kSignal, "a", SIGUSR1);
  ASSERT_TRUE(r.ok);
  EXPECT_EQ(h.TakeSignals("a:0"), std::vector<int>{SIGUSR1});
  EXPECT_EQ(h.State("a:0"), "RUNNING");
  EXPECT_FALSE(h.Ctl(ControlVerb::kSignal, "a", 0).ok);
  h.core().OnSignal(SIGTERM);
  h.Pump();
  EXPECT_FALSE(h.Ctl(ControlVerb::kRestart, "a").ok) << "the run is stopping";
}

TEST(SupervisorCoreControl, StatusNamesEveryProcess) {
  Harness h(Role("a", 2, ""));
  h.Start();
  RunStatus s = h.core().Status();
  ASSERT_EQ(s.processes.size(), 2u);
  EXPECT_EQ(s.processes[1].name, "a:1");
  EXPECT_EQ(s.processes[1].state, "RUNNING");
  EXPECT_GT(s.processes[1].pid, 0);
  std::string err;
  RunStatus back;
  ASSERT_TRUE(FromJson(ToJson(s), &back, &err)) << err;
}

}  // namespace
}  // namespace dflash
