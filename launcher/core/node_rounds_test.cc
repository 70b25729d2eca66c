// NodeRounds through the core (core_test_harness.h): restarts wider than one process become rounds of every
// node (a coordination store, several nodes).
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

// --- node rounds (a coordination store, several nodes) ---

const char* kAllOnce =
    "restart = { policy = \"on-failure\", scope = \"all\", max = 1, window = \"1h\", backoff = \"1s..1s\" }\n"
    "stop = { signal = \"SIGTERM\", grace = \"2s\" }";

TEST(SupervisorCoreRounds, AFailureWithScopeAllAsksForARoundAndHoldsUntilEveryNodeStopped) {
  Harness h(Role("a", 2, kAllOnce));
  h.core().node_rounds = true;
  h.Start();
  h.Exit("a:1", 1);
  // Not restarted locally: a round of every node is asked for, from round 0.
  EXPECT_EQ(h.Taken(CoreAction::Kind::kRoundRequest), std::vector<size_t>{0});
  EXPECT_EQ(h.State("a:1"), "BACKOFF");
  EXPECT_EQ(h.State("a:0"), "RUNNING");  // until the round begins (the store says so)
  h.Advance(Millis(5000));
  EXPECT_EQ(h.Spawns("a:1"), 1);  // held: no local restart, whatever the backoff
  h.core().BeginRound(1, "a:1 failed on node 0");
  h.Pump();
  EXPECT_EQ(h.State("a:0"), "STOPPING");
  EXPECT_TRUE(h.Taken(CoreAction::Kind::kRoundStopped).empty());  // a:0 still runs
  h.Exit("a:0", 143);
  EXPECT_EQ(h.Taken(CoreAction::Kind::kRoundStopped), std::vector<size_t>{1});
  h.Advance(Millis(5000));
  EXPECT_EQ(h.Spawns("a:0"), 1);  // held until every node has stopped
  h.core().StartRound(1);
  h.Pump();
  h.Advance(Millis(0));
  EXPECT_EQ(h.Spawns("a:0"), 2);
  EXPECT_EQ(h.Spawns("a:1"), 2);
  EXPECT_EQ(h.core().round(), 1);
  EXPECT_FALSE(h.core().stopping());
}

TEST(SupervisorCoreRounds, ANodeThatDidNotFailFollowsTheRoundAndItsBudgetIsNotCharged) {
  Harness h(Role("a", 1, kAllOnce));
  h.core().node_rounds = true;
  h.Start();
  h.core().BeginRound(1, "asked by node 1");
  h.Pump();
  h.Exit("a:0", 143);
  EXPECT_EQ(h.Taken(CoreAction::Kind::kRoundStopped), std::vector<size_t>{1});
  h.core().StartRound(1);
  h.Pump();
  h.Advance(Millis(0));
  EXPECT_EQ(h.Spawns("a:0"), 2);
  // Its one restart is still there: a failure now asks for round 2.
  h.Exit("a:0", 1);
  EXPECT_EQ(h.Taken(CoreAction::Kind::kRoundRequest), std::vector<size_t>{1});
  EXPECT_FALSE(h.core().stopping());
}

TEST(SupervisorCoreRounds, ABudgetExhaustedStopsTheRunInsteadOfAskingForARound) {
  Harness h(Role("a", 1, kAllOnce));
  h.core().node_rounds = true;
  h.Start();
  h.Exit("a:0", 1);
  h.core().BeginRound(1, "");
  h.Pump();
  h.core().StartRound(1);
  h.Pump();
  h.Advance(Millis(1000));
  h.Exit("a:0", 5);
  EXPECT_EQ(h.Taken(CoreAction::Kind::kRoundRequest).size(), 1u);
  EXPECT_TRUE(h.core().stopping());
  EXPECT_EQ(h.core().ExitCode(), 5);
}

TEST(SupervisorCoreRounds, ScopeProcessStaysLocal) {
  Harness h(Role("a", 2, kOnFailure3));
  h.core().node_rounds = true;
  h.Start();
  h.Exit("a:1", 1);
  h.Advance(Millis(1000));
  EXPECT_TRUE(h.Taken(CoreAction::Kind::kRoundRequest).empty());
  EXPECT_EQ(h.Spawns("a:1"), 2);
}

TEST(SupervisorCoreRounds, AStaleOrRepeatedRoundIsIgnoredAndAStopForANodeWins) {
  Harness h(Role("a", 1, kAllOnce));
  h.core().node_rounds = true;
  h.Start();
  h.core().StartRound(1);  // never begun: nothing
  h.Pump();
  EXPECT_EQ(h.State("a:0"), "RUNNING");
  h.core().BeginRound(1, "");
  h.core().BeginRound(1, "");  // the same round twice: one stop
  h.Pump();
  EXPECT_EQ(h.TakeSignals("a:0"), std::vector<int>{SIGTERM});
  // The round waits; another node's failure ends the run: the held process is not restarted.
  h.Exit("a:0", 143);
  h.core().StopForNode(
      {{NodeCulprit::Kind::kNodeFailed, 1, "b:0", -1}, "node 1 failed: b:0 exited with code 3", 70, nullptr});
  h.Pump();
  EXPECT_TRUE(h.core().Done());
  EXPECT_EQ(h.core().ExitCode(), 70);
  EXPECT_EQ(h.core().ExitReason(), "node 1 failed: b:0 exited with code 3");
  EXPECT_EQ(h.core().culprit(), -1);
}

}  // namespace
}  // namespace dflash
