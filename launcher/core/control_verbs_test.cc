// ControlVerbs through the core (core_test_harness.h): ctl restart, stop, start, signal and status, by hand.
#include <gtest/gtest.h>

#include <csignal>
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
  EXPECT_EQ(h.Proc("a:1").manual_restarts, 3);
  EXPECT_EQ(h.Proc("a:1").restarts, 0);
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
  EXPECT_EQ(h.Proc("a:1").restarts, 0);
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
