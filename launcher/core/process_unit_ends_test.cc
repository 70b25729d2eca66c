// ProcessUnit's side of the run's moves (process_unit_ends.cc), on lone units without a core
// (core_test::LoneUnits): a restart of its unit, the run's stop, and each kind of end.
#include <gtest/gtest.h>

#include <optional>
#include <string>
#include <vector>

#include "launcher/core/core_test_harness.h"

namespace dflash {
namespace {

using core_test::Harness;
using core_test::kOnFailure3;
using core_test::LoneUnits;
using core_test::Role;

const char* kHttpReadyTry =
    "ready = { mode = \"http\", url = \"http://127.0.0.1:8080/health\", interval = \"500ms\", timeout = \"10s\" }";

/// Unit `i` started and running its exec (pid 100 + i).
void StartLone(LoneUnits& lone, size_t i) {
  ProcessUnit& u = lone.units[i];
  u.BeginAttempt(std::nullopt);
  u.Spawned(static_cast<pid_t>(100 + i));
  u.SettleExec(true, "");
}

ExitStatus ExitedWith(int code) {
  ExitStatus st;
  st.exited = true;
  st.code = code;
  return st;
}

TEST(ProcessUnitEnds, ARestartOfItsUnitStopsItAliveAndWaitsEndedButLeavesItHeld) {
  Harness h(Role("a", 3, kOnFailure3));
  LoneUnits lone(h.plan());
  for (size_t i = 0; i < 3; ++i) StartLone(lone, i);
  SteadyTime at = lone.now + std::chrono::seconds(4);
  lone.units[0].RestartWithUnit(at, "restarting the role");
  EXPECT_EQ(lone.units[0].state(), ProcState::kStopping);
  EXPECT_EQ(lone.units[0].intent(), EndIntent::kRestart);
  EXPECT_EQ(lone.units[0].view().restart_at, at);
  EXPECT_EQ(lone.Count(CoreAction::Kind::kSignal), 1);

  lone.units[1].Hold();
  lone.units[1].RestartWithUnit(at, "restarting the role");
  EXPECT_EQ(lone.units[1].state(), ProcState::kStarting) << "held by ctl: stays as it is";
  EXPECT_EQ(lone.Count(CoreAction::Kind::kSignal), 1);

  // Ended and waiting for a later restart already: the later one stands.
  lone.units[2].EndAttempt(ExitedWith(1), {});
  lone.units[2].SetRestartAt(at + std::chrono::seconds(10));
  lone.units[2].Enter(ProcState::kBackoff, "its own restart");
  lone.units[2].RestartWithUnit(at, "restarting the role");
  EXPECT_EQ(lone.units[2].view().restart_at, at + std::chrono::seconds(10));
  EXPECT_EQ(lone.units[2].state(), ProcState::kBackoff);
}

TEST(ProcessUnitEnds, TheRunsStopStopsItOrWaitsForItsDependentsOrSaysWhyItNeverStarted) {
  Harness h(Role("a", 4, kOnFailure3));
  LoneUnits lone(h.plan());
  StartLone(lone, 0);
  StartLone(lone, 1);
  lone.units[0].StopWithRun(/*live_dependents=*/true, "");
  EXPECT_TRUE(lone.units[0].view().stops_after_dependents);
  EXPECT_EQ(lone.units[0].state(), ProcState::kStarting) << "its signal waits for what starts after it";
  EXPECT_EQ(lone.Count(CoreAction::Kind::kSignal), 0);
  lone.units[1].StopWithRun(false, "");
  EXPECT_EQ(lone.units[1].state(), ProcState::kStopping);
  EXPECT_EQ(lone.units[1].intent(), EndIntent::kStop);
  EXPECT_EQ(lone.Count(CoreAction::Kind::kSignal), 1);

  lone.units[2].Enter(ProcState::kWaiting, "until its warm-up");
  lone.units[2].StopWithRun(false, "a:warmup has compiled");
  EXPECT_EQ(lone.units[2].state(), ProcState::kNotStarted);
  EXPECT_EQ(lone.units[2].view().reason, "not started: the run stopped before a:warmup has compiled");
  lone.units[3].StopWithRun(false, "");
  EXPECT_EQ(lone.units[3].view().reason, "not started: the run stopped before its turn");
}

TEST(ProcessUnitEnds, AnEndWhileTheRunStopsIsCollateralByHandOrItsOwnFailureToStart) {
  Harness h(Role("a", 3, kOnFailure3));
  LoneUnits lone(h.plan());
  for (size_t i = 0; i < 3; ++i) StartLone(lone, i);
  lone.units[0].EndWhileStopping(/*blamed_elsewhere=*/true, lone.units[0].EndAttempt(ExitedWith(1), {}));
  EXPECT_EQ(lone.units[0].view().last()->outcome, AttemptOutcome::kCollateral);
  EXPECT_EQ(lone.units[0].state(), ProcState::kExited);

  lone.units[1].Hold();
  lone.units[1].EndWhileStopping(true, lone.units[1].EndAttempt(ExitedWith(0), {}));
  EXPECT_EQ(lone.units[1].view().last()->outcome, AttemptOutcome::kStoppedByCtl) << "by hand, before collateral";

  lone.units[2].SpawnFailed("exec: no such file", 102);
  lone.units[2].EndWhileStopping(true, lone.units[2].EndAttempt(ExitedWith(127), {}));
  EXPECT_EQ(lone.units[2].view().last()->outcome, AttemptOutcome::kFailed) << "its own failure, not collateral";
  EXPECT_EQ(lone.units[2].state(), ProcState::kFailed);
}

TEST(ProcessUnitEnds, AnEndForARestartWaitsInBackoffAndAFailureThatEndsTheRunIsFatal) {
  Harness h(Role("a", 2, kOnFailure3));
  LoneUnits lone(h.plan());
  StartLone(lone, 0);
  StartLone(lone, 1);
  lone.units[0].EndForRestart(lone.units[0].EndAttempt(ExitedWith(143), {}));
  EXPECT_EQ(lone.units[0].state(), ProcState::kBackoff);
  EXPECT_EQ(lone.units[0].view().last()->outcome, AttemptOutcome::kRestarted);
  EXPECT_TRUE(lone.units[0].view().last()->with_unit);

  lone.units[1].EndFailed("exited with code 3; restart budget exhausted", /*fatal=*/true);
  EXPECT_EQ(lone.units[1].state(), ProcState::kStarting) << "alive: it enters FATAL once it has ended";
  lone.units[1].EndAttempt(ExitedWith(3), {});
  lone.units[1].EndFailed("exited with code 3; restart budget exhausted", true);
  EXPECT_EQ(lone.units[1].state(), ProcState::kFatal);
  EXPECT_EQ(lone.units[1].view().reason, "exited with code 3; restart budget exhausted");
}

TEST(ProcessUnitEnds, AWarmupThatEndsZeroSaysWhetherItsReadyIsThere) {
  Harness h(Role("d", 2, "gate = true"));
  LoneUnits lone(h.plan());
  ASSERT_EQ(lone.units.size(), 3u);
  ProcessUnit& w = lone.units[2];
  ASSERT_TRUE(w.plan().warmup);
  StartLone(lone, 2);
  w.EndAttempt(ExitedWith(0), {});
  EXPECT_FALSE(w.EndWarmup()) << "no gate facts: nothing published";
  EXPECT_EQ(w.view().why, "ended without publishing READY: the role's processes compile on their own");
  StartLone(lone, 2);
  NotifyFields g;
  g.gate_role = GateRole::kLead;
  g.gate_state = GateState::kReady;
  g.gate_compile_s = 12.0;
  w.TakeGateFacts(g);
  w.EndAttempt(ExitedWith(0), {});
  EXPECT_TRUE(w.EndWarmup());
  EXPECT_EQ(w.state(), ProcState::kExited);
  EXPECT_EQ(w.view().last()->outcome, AttemptOutcome::kSucceeded);
}

TEST(ProcessUnitEnds, AServiceThatEndsZeroEndedTooEarlyAndSaysSo) {
  Harness h(Role("s", 1, "service = true") + Role("job", 1, ""));
  LoneUnits lone(h.plan());
  StartLone(lone, 0);
  StartLone(lone, 1);
  std::string how = lone.units[0].EndAttempt(ExitedWith(0), {});
  EXPECT_TRUE(lone.units[0].ServiceEndedEarly(&how));
  EXPECT_EQ(how, "exited with code 0 (a service must run until the run ends)");
  EXPECT_EQ(lone.units[0].view().last()->reason, how) << "its record says so too";
  std::string job = lone.units[1].EndAttempt(ExitedWith(0), {});
  EXPECT_FALSE(lone.units[1].ServiceEndedEarly(&job)) << "no service: exit 0 is a success";
  EXPECT_EQ(job, "exited with code 0");
}

TEST(ProcessUnitEnds, NotReadyInTimeIsRecordedAndSaidWithItsPid) {
  Harness h(Role("s", 1, kHttpReadyTry));
  LoneUnits lone(h.plan());
  StartLone(lone, 0);
  ASSERT_NE(lone.units[0].readiness(), nullptr) << "a direct process: its readiness is judged here";
  std::string why = lone.units[0].ReadyTimedOut();
  EXPECT_TRUE(lone.units[0].view().last()->ready_timeout);
  EXPECT_EQ(why.rfind("(pid 100) ", 0), 0u) << why;
  EXPECT_EQ(why.substr(10), lone.units[0].readiness()->TimeoutText());
}

TEST(ProcessUnitEnds, AnEndThePolicyDoesNotRestartIsASuccessAFailureOrFatal) {
  Harness h(Role("a", 4, kOnFailure3));
  LoneUnits lone(h.plan());
  for (size_t i = 0; i < 4; ++i) StartLone(lone, i);
  RestartDecision never{RestartDecision::Kind::kNoRestart, Millis(0), "restart policy is \"never\""};
  bool fatal = true;
  EXPECT_EQ(lone.units[0].EndByPolicy(never, false, lone.units[0].EndAttempt(ExitedWith(0), {}), &fatal), "");
  EXPECT_FALSE(fatal);
  EXPECT_EQ(lone.units[0].state(), ProcState::kExited);
  EXPECT_EQ(lone.units[0].view().last()->outcome, AttemptOutcome::kSucceeded);

  std::string how = lone.units[1].EndAttempt(ExitedWith(3), {});
  EXPECT_EQ(lone.units[1].EndByPolicy(never, false, how, &fatal), "exited with code 3 (restart policy is \"never\")");
  EXPECT_FALSE(fatal);
  EXPECT_EQ(lone.units[1].view().last()->outcome, AttemptOutcome::kFailed);

  how = lone.units[2].EndAttempt(ExitedWith(0), {});
  EXPECT_EQ(lone.units[2].EndByPolicy(never, /*service_ended=*/true, how, &fatal),
            "exited with code 0 (restart policy is \"never\")") << "a service's exit 0 is a failure";

  RestartDecision spent{RestartDecision::Kind::kExhausted, Millis(0), "restart budget exhausted"};
  how = lone.units[3].EndAttempt(ExitedWith(7), {});
  EXPECT_EQ(lone.units[3].EndByPolicy(spent, false, how, &fatal), "exited with code 7; restart budget exhausted");
  EXPECT_TRUE(fatal);
  EXPECT_EQ(lone.units[3].view().last()->outcome, AttemptOutcome::kFatal);
}

TEST(ProcessUnitEnds, ItsOwnRestartWaitsInBackoffOrForTheRound) {
  Harness h(Role("a", 2, kOnFailure3));
  LoneUnits lone(h.plan());
  StartLone(lone, 0);
  StartLone(lone, 1);
  SteadyTime at = lone.now + std::chrono::seconds(2);
  lone.units[0].EndForOwnRestart(at, lone.units[0].EndAttempt(ExitedWith(1), {}), "restart 1 of 3", /*round=*/false);
  EXPECT_EQ(lone.units[0].state(), ProcState::kBackoff);
  EXPECT_EQ(lone.units[0].view().restart_at, at);
  EXPECT_EQ(CountRestarts(lone.units[0].view().attempts).own, 1);
  EXPECT_EQ(lone.units[0].view().why, "exited with code 1; restart 1 of 3");
  lone.units[1].EndForOwnRestart(at, lone.units[1].EndAttempt(ExitedWith(1), {}), "restart 1 of 3", /*round=*/true);
  EXPECT_EQ(lone.units[1].view().restart_at, SteadyTime::max()) << "held until the round starts it";
  EXPECT_EQ(lone.units[1].view().why, "exited with code 1; restart 1 of 3; every node restarts in a new round");
}

TEST(ProcessUnitEnds, AFailedWarmupIsFatalAndPointsAtItsLog) {
  Harness h(Role("d", 2, "gate = true"));
  LoneUnits lone(h.plan());
  StartLone(lone, 2);
  std::string why = lone.units[2].EndWarmupFailed(lone.units[2].EndAttempt(ExitedWith(1), {}), "/runs/t/d-warmup.log");
  EXPECT_EQ(why, "warm-up failed: exited with code 1 (its log: /runs/t/d-warmup.log)");
  EXPECT_EQ(lone.units[2].view().last()->outcome, AttemptOutcome::kFatal);
}

TEST(ProcessUnitEnds, AStopHeldForItsDependentsIsSentOnceTheyHaveEnded) {
  Harness h(Role("a", 1, kOnFailure3));
  LoneUnits lone(h.plan());
  StartLone(lone, 0);
  lone.units[0].StopWithRun(/*live_dependents=*/true, "");
  lone.units[0].StopOnceDependentsEnded(/*live_dependents=*/true);
  EXPECT_EQ(lone.Count(CoreAction::Kind::kSignal), 0) << "they still run";
  lone.units[0].StopOnceDependentsEnded(false);
  EXPECT_EQ(lone.Count(CoreAction::Kind::kSignal), 1);
  EXPECT_EQ(lone.units[0].state(), ProcState::kStopping);
  EXPECT_FALSE(lone.units[0].view().stops_after_dependents);
  lone.units[0].StopOnceDependentsEnded(false);
  EXPECT_EQ(lone.Count(CoreAction::Kind::kSignal), 1) << "once";
}

}  // namespace
}  // namespace dflash
