// Incident through the core (core_test_harness.h): which failure is the culprit, when an incident ends, what is
// collateral, and the one verdict.
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

TEST(SupervisorCore, ABudgetExhaustedIsFatalAndStopsTheRun) {
  Harness h(Role("a", 1, kOnFailure3) + Role("b", 1, "stop = { signal = \"SIGINT\", grace = \"5s\" }"));
  h.Start();
  for (int k = 0; k < 3; ++k) {
    h.Exit("a:0", 7);
    h.Advance(Millis(10000));
  }
  EXPECT_EQ(h.Spawns("a:0"), 4);
  h.Exit("a:0", 7);
  EXPECT_EQ(h.State("a:0"), "FATAL");
  EXPECT_TRUE(h.core().stopping());
  EXPECT_EQ(h.State("b:0"), "STOPPING");
  EXPECT_EQ(h.TakeSignals("b:0"), std::vector<int>{SIGINT});
  h.Killed("b:0", SIGINT);
  EXPECT_TRUE(h.core().Done());
  EXPECT_EQ(h.core().ExitCode(), 7);
  EXPECT_EQ(h.core().culprit(), static_cast<int>(h.Index("a:0")));
  EXPECT_EQ(h.CulpritAttempt()->attempt, 3) << "the same process failing again: its last failure";
  EXPECT_EQ(h.core().ExitReason().rfind("a:0 exited with code 7; restart budget exhausted", 0), 0u)
      << h.core().ExitReason();
  EXPECT_EQ(std::string(AttemptOutcomeName(h.Proc("b:0").last()->outcome)), "collateral");
}

TEST(SupervisorCore, TheCulpritIsTheFirstFailureOfTheIncidentEvenIfItWasRestarted) {
  // One world in fact, declared independent: drafter:1 exits 3 and is
  // restarted; its peers then fail with 1 ("connection closed") and cannot be.
  Harness h(Role("target", 2, "restart = { policy = \"never\" }") + Role("drafter", 2, kOnFailure3));
  h.Start();
  h.Exit("drafter:1", 3);
  h.Advance(Millis(1000));
  EXPECT_EQ(h.State("drafter:1"), "RUNNING");
  h.Exit("target:1", 1);
  EXPECT_TRUE(h.core().stopping());
  EXPECT_EQ(h.core().culprit(), static_cast<int>(h.Index("drafter:1")));
  EXPECT_EQ(h.CulpritAttempt()->attempt, 0);
  EXPECT_EQ(h.core().ExitCode(), 3);
  EXPECT_NE(h.core().ExitReason().find("drafter:1 exited with code 3"), std::string::npos) << h.core().ExitReason();
  EXPECT_NE(h.core().ExitReason().find("target:1"), std::string::npos) << h.core().ExitReason();
}

TEST(Incident, TheVerdictSaysTheCulpritsFailureInTheWordsOfItsRow) {
  // The root cause was restarted: its row names that attempt, not what the process did last.
  Harness h(Role("target", 2, "restart = { policy = \"never\" }") + Role("drafter", 2, kOnFailure3));
  h.Start();
  h.Exit("drafter:1", 3);
  h.Advance(Millis(1000));
  h.Exit("target:1", 1);
  EXPECT_EQ(h.core().Verdict().culprit_why, "exited with code 3 (attempt 0, restarted)");

  // Its own last failure: its reason as it stands, the policy's words included.
  Harness last(Role("a", 1, kOnFailure3));
  last.Start();
  for (int k = 0; k < 4; ++k) {
    last.Exit("a:0", 7);
    last.Advance(Millis(10000));
  }
  RunVerdict v = last.core().Verdict();
  EXPECT_EQ(v.culprit_why, last.Proc("a:0").reason);
  EXPECT_EQ(v.culprit_why.rfind("exited with code 7; restart budget exhausted", 0), 0u) << v.culprit_why;

  Harness none(Role("a", 1, kOnFailure3));
  none.Start();
  none.Exit("a:0", 0);
  EXPECT_EQ(none.core().Verdict().culprit_why, "") << "no culprit: no words";
}

TEST(Incident, ACulpritWhoseRestartTheStopCutShortIsNotCalledRestarted) {
  // The CI's ordering under load: drafter:1 exits 3, and its peer's failure comes within the backoff, before the
  // restart: the run stops, the restart never comes. Its row, the verdict and summary.json say what happened.
  Harness h(Role("target", 2, "restart = { policy = \"never\" }") + Role("drafter", 2, kOnFailure3));
  h.Start();
  h.Exit("drafter:1", 3);
  ASSERT_EQ(h.State("drafter:1"), "BACKOFF");
  h.Exit("target:1", 1);
  EXPECT_EQ(h.State("drafter:1"), "EXITED");
  EXPECT_EQ(h.Spawns("drafter:1"), 1) << "no restart after the stop began";
  RunVerdict v = h.core().Verdict();
  EXPECT_EQ(v.culprit, "drafter:1");
  EXPECT_EQ(v.exit_code, 3);
  EXPECT_EQ(v.reason.rfind("drafter:1 exited with code 3; then target:1 exited with code 1", 0), 0u) << v.reason;
  EXPECT_EQ(v.reason.find("restarted"), std::string::npos) << v.reason;
  EXPECT_EQ(v.culprit_why.find("restarted"), std::string::npos) << v.culprit_why;
  EXPECT_EQ(std::string(AttemptOutcomeName(h.Proc("drafter:1").last()->outcome)), "failed");
}

TEST(SupervisorCore, AFailureAfterTheRunHealedIsANewIncident) {
  Harness h(Role("target", 1, "restart = { policy = \"never\" }") +
            Role("drafter", 1, "restart = { policy = \"on-failure\", max = 3, backoff = \"1s..1s\", reset_after = \"1m\" }"));
  h.Start();
  h.Exit("drafter:0", 3);
  h.Advance(Millis(1000));
  h.Advance(Millis(61000));  // everyone ran reset_after since: healthy again
  h.Exit("target:0", 1);
  EXPECT_EQ(h.core().culprit(), static_cast<int>(h.Index("target:0")));
  EXPECT_EQ(h.core().ExitCode(), 1);
}

TEST(SupervisorCore, AnExecThatFailsWhileTheRunStopsIsItsFailureNotCollateral) {
  Harness h(Role("a", 1, kOnFailure3) + Role("b", 1, kOnFailure3));
  h.Start();                 // both exec'd
  h.exec_pending_ = true;    // the next spawn's exec is still pending when the stop comes
  h.Exit("b:0", 1);
  h.Advance(Millis(1000));   // b's backoff: spawned again, exec pending
  ASSERT_EQ(h.Spawns("b:0"), 2);
  h.SettleExecAs(false, "cannot execute /nope: Permission denied");
  h.core().OnSignal(SIGTERM);
  h.Pump();
  EXPECT_TRUE(h.TakeSignals("b:0").empty()) << "a process whose exec failed is not stopped: it ends by itself";
  EXPECT_EQ(h.TakeSignals("a:0"), std::vector<int>{SIGTERM});
  h.Exit("b:0", 126);
  EXPECT_EQ(h.State("b:0"), "FAILED");
  EXPECT_TRUE(h.Proc("b:0").last()->start_failed);
  EXPECT_NE(std::string(AttemptOutcomeName(h.Proc("b:0").last()->outcome)), "collateral");
}


TEST(Incident, AStopForANodeIsNamedByTheVerdictAlone) {
  using K = NodeCulprit::Kind;
  EXPECT_EQ(NodeCulpritName({K::kNodeFailed, 1, "w:3", -1}), "node 1: w:3");
  EXPECT_EQ(NodeCulpritName({K::kNodeFailed, 2, "", -1}), "node 2");  // the store did not say which process
  EXPECT_EQ(NodeCulpritName({K::kNodeLost, 1, "", -1}), "node 1 (launcher lost)");
  EXPECT_EQ(NodeCulpritName({K::kNodeReplaced, 3, "", -1}), "node 3 (replaced)");
  EXPECT_EQ(NodeCulpritName({K::kLeftBehind, 2, "", -1}), "node 2 (left behind)");
  EXPECT_EQ(NodeCulpritName({K::kStore, -1, "", -1}), "the store");
  EXPECT_EQ(NodeCulpritName({K::kPrivateStore, 0, "", -1}), "node 0 (its private store)");
  EXPECT_EQ(NodeCulpritName({K::kRound, -1, "", 4}), "round 4");
  // The verdict gives that name, with the stop's own exit code and record.
  Harness h(Role("a", 1, kOnFailure3));
  h.Start();
  h.core().StopForNode({{K::kNodeLost, 1, "", -1}, "node 1's launcher lost", exit_code::kNodeFailed, {{"node", 1}}});
  h.Killed("a:0", SIGTERM);
  ASSERT_TRUE(h.core().Done());
  RunVerdict v = h.core().Verdict("");
  EXPECT_EQ(v.culprit, "node 1 (launcher lost)");
  EXPECT_EQ(v.exit_code, exit_code::kNodeFailed);
  EXPECT_EQ(v.reason, "node 1's launcher lost");
  EXPECT_EQ(v.node_culprit, nlohmann::json({{"node", 1}}));
}

// A world of 3: d:1 is killed, d:0 goes down with it on its own (a gloo error), d:2 is stopped for the restart.
// The story names d:1 alone, with the step it reached and the one its next attempt resumed from.
TEST(SupervisorCoreStory, ARestartedWorldIsToldByTheRankThatFailedFirstWithItsSteps) {
  // Attempt 0 of each reached step 25 (its metrics); attempt 1 resumed from 20 and ran 80 steps: what the shell
  // read of each attempt's metrics file when it reaped it, told with its end (`told`: false, nothing told).
  auto run = [](Harness& h, bool told) {
    AttemptFiles first, second;
    if (told) {
      first.training = AttemptTraining{25, 25, 0};
      second.training = AttemptTraining{80, 100, 20};
    }
    h.Start();
    h.Killed("d:1", SIGKILL, first);
    h.Exit("d:0", 1, first);  // its peer died under it: an echo, not a root cause
    h.Killed("d:2", SIGTERM, first);
    h.Advance(Millis(1500));
    for (const char* n : {"d:0", "d:1", "d:2"}) ASSERT_EQ(h.State(n), "RUNNING") << n;
    for (const char* n : {"d:0", "d:1", "d:2"}) h.Exit(n, 0, second);
    ASSERT_TRUE(h.core().Done());
  };
  Harness h(Role("d", 3, kOnFailure3 + std::string("\nworld = \"role\"")));
  run(h, true);
  RunVerdict v = h.core().Verdict();
  EXPECT_EQ(v.exit_code, 0);
  EXPECT_EQ(v.reason, "all processes succeeded (after 1 restart: d:1 killed by SIGKILL at step 25, resumed from step 20 "
                      "(restarted with it: d:0, d:2))");
  ASSERT_EQ(v.restarts.size(), 1u);
  EXPECT_EQ(v.restarts[0].process, "d:1");
  EXPECT_EQ(v.restarts[0].signal, SIGKILL);
  EXPECT_EQ(v.restarts[0].attempt, 0);
  EXPECT_EQ(v.restarts[0].step, 25);
  EXPECT_EQ(v.restarts[0].resumed_from_step, 20);
  EXPECT_EQ(h.core().Summary(1.0).reason, v.reason) << "the summary's verdict is the same one";
  // Without the training metrics: the same story, no steps.
  Harness bare(Role("d", 3, kOnFailure3 + std::string("\nworld = \"role\"")));
  run(bare, false);
  EXPECT_EQ(bare.core().ExitReason(), "all processes succeeded (after 1 restart: d:1 killed by SIGKILL (restarted with it: "
                                   "d:0, d:2))");
}

TEST(SupervisorCoreStory, TwoIndependentFailuresAreTwoRestartsInTheOrderTheyHappened) {
  Harness h(Role("t", 2, kOnFailure3) + Role("d", 2, kOnFailure3));
  h.Start();
  h.Killed("t:1", SIGKILL);
  h.Exit("d:1", 3);  // another process, not of t:1's unit: its own failure, though the run had not healed
  h.Advance(Millis(1500));
  h.Killed("d:1", SIGSEGV);  // the restarted one fails again: a failure of its own too
  h.Advance(Millis(2500));
  for (const char* n : {"t:0", "t:1", "d:0", "d:1"}) h.Exit(n, 0);
  ASSERT_TRUE(h.core().Done());
  RunVerdict v = h.core().Verdict("");
  ASSERT_EQ(v.restarts.size(), 3u) << v.reason;
  EXPECT_EQ(v.restarts[0].process, "t:1");
  EXPECT_EQ(v.restarts[1].process, "d:1");
  EXPECT_EQ(v.restarts[1].exit_code, 3);
  EXPECT_EQ(v.restarts[2].process, "d:1");
  EXPECT_EQ(v.restarts[2].attempt, 1);
  EXPECT_EQ(v.reason, "all processes succeeded (after 3 restarts: t:1 killed by SIGKILL; d:1 exited with code 3; "
                      "d:1 killed by SIGSEGV)");
}

TEST(SupervisorCoreStory, ARestartByCtlIsToldAsOne) {
  Harness h(Role("a", 2, kOnFailure3));
  h.Start();
  ASSERT_TRUE(h.Ctl(ControlVerb::kRestart, "a:1").ok);
  h.Killed("a:1", SIGTERM);
  h.Advance(Millis(1500));
  ASSERT_EQ(h.State("a:1"), "RUNNING");
  h.Exit("a:0", 0);
  h.Exit("a:1", 0);
  ASSERT_TRUE(h.core().Done());
  RunVerdict v = h.core().Verdict("");
  ASSERT_EQ(v.restarts.size(), 1u);
  EXPECT_TRUE(v.restarts[0].by_ctl);
  EXPECT_EQ(v.reason, "all processes succeeded (after 1 restart: a:1 restarted by ctl)");
}

TEST(Incident, BlameNamesTheFirstFailureOfTheIncidentAndSaysWhatTheRunStopsFor) {
  core_test::Harness h(Role("a", 3, kOnFailure3));
  core_test::LoneUnits lone(h.plan());
  for (ProcessUnit& u : lone.units) u.BeginAttempt(std::nullopt);
  Incident incident(lone.units);
  incident.NoteFailure(0, lone.now, {0});  // a:0 failed first (and was restarted, say)
  lone.units[1].SetReason("exited with code 1");
  EXPECT_EQ(incident.Blame(1), "a:1 exited with code 1") << "the stop names who ended the run";
  EXPECT_EQ(incident.culprit(), 0) << "the culprit is the incident's first failure";
  EXPECT_TRUE(incident.BlamesOther(1));
  EXPECT_FALSE(incident.BlamesOther(0));
  lone.units[2].SetReason("exited with code 2");
  EXPECT_EQ(incident.Blame(2), "a:2 exited with code 2");
  EXPECT_EQ(incident.culprit(), 0) << "the first culprit stands";
}

}  // namespace
}  // namespace dflash
