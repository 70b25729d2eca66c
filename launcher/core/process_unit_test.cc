// ProcessUnit through the core (core_test_harness.h): a process's attempts, backoff and stop grace, spawns and
// execs that fail or settle late, readiness (notify, a direct process, network probes), the watchdog.
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

TEST(SupervisorCore, RestartsAfterAnExponentialBackoff) {
  Harness h(Role("a", 1, kOnFailure3));
  h.Start();
  h.Exit("a:0", 1);
  EXPECT_EQ(h.State("a:0"), "BACKOFF");
  h.Advance(Millis(999));
  EXPECT_EQ(h.Spawns("a:0"), 1) << "not before its 1s backoff";
  h.Advance(Millis(1));
  EXPECT_EQ(h.Spawns("a:0"), 2);
  EXPECT_EQ(h.State("a:0"), "RUNNING");
  h.Exit("a:0", 1);  // ran 0s: the backoff doubles
  h.Advance(Millis(1999));
  EXPECT_EQ(h.Spawns("a:0"), 2);
  h.Advance(Millis(1));
  EXPECT_EQ(h.Spawns("a:0"), 3);
  EXPECT_EQ(h.Restarts("a:0").own, 2);
  ASSERT_EQ(h.Proc("a:0").attempts.size(), 3u);
  EXPECT_EQ(std::string(AttemptOutcomeName(h.Proc("a:0").attempts[0].outcome)), "restarted");
  EXPECT_EQ(h.Proc("a:0").attempts[0].exit_code, 1);
}

TEST(SupervisorCore, StopGraceEndsInSigkill) {
  Harness h(Role("a", 1, kOnFailure3));
  h.Start();
  h.core().OnSignal(SIGTERM);
  h.Pump();
  EXPECT_EQ(h.TakeSignals("a:0"), std::vector<int>{SIGTERM});
  h.Advance(Millis(1999));
  EXPECT_TRUE(h.TakeSignals("a:0").empty());
  h.Advance(Millis(1));
  EXPECT_EQ(h.TakeSignals("a:0"), std::vector<int>{SIGKILL});
  h.Killed("a:0", SIGKILL);
  EXPECT_TRUE(h.core().Done());
  EXPECT_EQ(h.core().ExitCode(), 128 + SIGTERM);
  EXPECT_EQ(h.State("a:0"), "EXITED") << "stopped, not a failure";
}

TEST(SupervisorCore, AStopSignalStopsTheRunAsSigtermDoes) {
  Harness h(Role("a", 1, kOnFailure3));
  h.core().stop_signals = {SIGUSR1};  // [run] stop_signals: a preemption notice
  h.Start();
  h.core().OnSignal(SIGUSR2);  // any other signal the shell hands over is forwarded; the run goes on
  h.Pump();
  EXPECT_EQ(h.TakeSignals("a:0"), std::vector<int>{SIGUSR2});
  EXPECT_FALSE(h.core().stopping());
  h.core().OnSignal(SIGUSR1);
  h.Pump();
  EXPECT_TRUE(h.core().stopping());
  EXPECT_EQ(h.TakeSignals("a:0"), std::vector<int>{SIGTERM}) << "the role's stop.signal: it checkpoints";
  h.Killed("a:0", SIGTERM);
  EXPECT_TRUE(h.core().Done());
  EXPECT_EQ(h.core().ExitCode(), 128 + SIGUSR1);
  EXPECT_EQ(h.State("a:0"), "EXITED") << "stopped, not a failure: no restart";
}

TEST(SupervisorCore, ASpawnThatFailsIsAFailureOfItsOwn) {
  Harness h(Role("a", 1, ""));
  h.spawn_fails_ = true;
  h.Start();
  EXPECT_EQ(h.State("a:0"), "FAILED");
  EXPECT_TRUE(h.core().Done());
  EXPECT_EQ(h.core().ExitCode(), 1);
  EXPECT_TRUE(h.Proc("a:0").last()->start_failed);
}

TEST(SupervisorCore, AnExecThatFailsIsAFailureOfItsOwnWithTheExecError) {
  Harness h(Role("a", 1, kOnFailure3));
  h.exec_pending_ = true;
  h.Start();
  EXPECT_EQ(h.State("a:0"), "STARTING");
  h.ExecResult("a:0", false, "cannot execute /nope: No such file or directory");
  EXPECT_EQ(h.State("a:0"), "STARTING");  // still to be reaped: it exits 127 on its own
  h.Exit("a:0", 127);
  EXPECT_TRUE(h.Proc("a:0").last()->start_failed);
  EXPECT_NE(h.Proc("a:0").last()->reason.find("No such file or directory"), std::string::npos)
      << h.Proc("a:0").last()->reason;
  EXPECT_NE(h.Proc("a:0").last()->reason.find("exit 127"), std::string::npos) << h.Proc("a:0").last()->reason;
}

const char* kRoleScope =
    "restart = { policy = \"on-failure\", scope = \"role\", max = 3, window = \"1h\", backoff = \"1s..1s\" }";

/// Two processes of a role restarted together; a:0's exec succeeded, a:1's is still pending.
void StartWithASecondExecPending(Harness& h) {
  h.exec_pending_ = true;
  h.Start();
  h.ExecResult("a:0", true);
  ASSERT_EQ(h.State("a:0"), "RUNNING");
  ASSERT_EQ(h.State("a:1"), "STARTING");
}

TEST(SupervisorCore, AStopOfAProcessWhoseExecIsPendingWaitsForTheOutcome) {
  Harness h(Role("a", 2, kRoleScope));
  StartWithASecondExecPending(h);
  h.core().OnSignal(SIGTERM);
  h.Pump();
  EXPECT_EQ(h.Taken(CoreAction::Kind::kSettleExec), std::vector<size_t>{h.Index("a:1")}) << "asked once";
  EXPECT_TRUE(h.TakeSignals("a:1").empty()) << "no signal before the shell says how its exec went";
  EXPECT_EQ(h.State("a:1"), "STARTING");
  EXPECT_EQ(h.TakeSignals("a:0"), std::vector<int>{SIGTERM});
  h.ExecResult("a:1", true);  // it succeeded, late: the stop held back goes out now
  EXPECT_EQ(h.TakeSignals("a:1"), std::vector<int>{SIGTERM});
  EXPECT_EQ(h.State("a:1"), "STOPPING");
  EXPECT_NE(h.Proc("a:1").why.find("stopping the run"), std::string::npos) << h.Proc("a:1").why;
  h.Killed("a:0", SIGTERM);
  h.Killed("a:1", SIGTERM);
  EXPECT_TRUE(h.core().Done());
  EXPECT_EQ(h.core().ExitCode(), 128 + SIGTERM);
  EXPECT_EQ(std::string(AttemptOutcomeName(h.Proc("a:1").last()->outcome)), "stopped");
}

TEST(SupervisorCore, AnExecThatFailsDuringARestartIsItsOwnFailureNotARestartOfItsUnit) {
  Harness h(Role("a", 2, kRoleScope));
  StartWithASecondExecPending(h);
  h.SettleExecAs(false, "cannot execute /nope: Permission denied");
  h.Exit("a:0", 1);  // its role restarts: a:1 is to be stopped, but its exec failed
  EXPECT_TRUE(h.TakeSignals("a:1").empty()) << "it ends by itself";
  EXPECT_EQ(h.Proc("a:1").intent, EndIntent::kNone) << "the restart's stop was dropped";
  h.Exit("a:1", 126);
  const AttemptRecord& rec = *h.Proc("a:1").last();
  EXPECT_TRUE(rec.start_failed);
  EXPECT_NE(rec.reason.find("Permission denied"), std::string::npos) << rec.reason;
  EXPECT_EQ(h.Restarts("a:1").own, 1) << "its failure counts against the budget, as a stop for a restart does not";
  EXPECT_EQ(h.State("a:1"), "BACKOFF");
  h.Advance(Millis(1000));
  EXPECT_EQ(h.Spawns("a:1"), 2);
}

TEST(SupervisorCore, AnExecThatSucceedsLateDuringARestartIsStoppedForIt) {
  Harness h(Role("a", 2, kRoleScope));
  StartWithASecondExecPending(h);
  h.Exit("a:0", 1);
  EXPECT_TRUE(h.TakeSignals("a:1").empty());
  EXPECT_EQ(h.Proc("a:1").intent, EndIntent::kRestart) << "decided: what comes next sees it";
  h.ExecResult("a:1", true);
  EXPECT_EQ(h.TakeSignals("a:1"), std::vector<int>{SIGTERM});
  h.Killed("a:1", SIGTERM);
  EXPECT_EQ(h.State("a:1"), "BACKOFF");
  EXPECT_EQ(h.Restarts("a:1").own, 0) << "stopped for its unit's restart: not its failure";
  EXPECT_EQ(std::string(AttemptOutcomeName(h.Proc("a:1").last()->outcome)), "restarted");
  h.Advance(Millis(1000));
  EXPECT_EQ(h.Spawns("a:0"), 2);
  EXPECT_EQ(h.Spawns("a:1"), 2);
}

TEST(SupervisorCore, ARunThatStopsWhileARestartWaitsForAnExecStopsItForGood) {
  Harness h(Role("a", 2, kRoleScope));
  StartWithASecondExecPending(h);
  h.Exit("a:0", 1);           // a:1's restart waits for its exec
  h.core().OnSignal(SIGINT);  // then the run stops
  h.Pump();
  EXPECT_EQ(h.Proc("a:1").intent, EndIntent::kStop);
  h.ExecResult("a:1", true);
  EXPECT_EQ(h.TakeSignals("a:1"), std::vector<int>{SIGTERM});
  h.Killed("a:1", SIGTERM);
  EXPECT_EQ(h.State("a:1"), "EXITED");
  h.Advance(Millis(5000));
  EXPECT_EQ(h.Spawns("a:1"), 1) << "not restarted: the run stopped";
  EXPECT_TRUE(h.core().Done());
}

TEST(SupervisorCore, ACtlStopOfAProcessWhoseExecIsPendingWaitsForTheOutcomeToo) {
  Harness h(Role("a", 2, kRoleScope));
  StartWithASecondExecPending(h);
  ASSERT_TRUE(h.Ctl(ControlVerb::kStop, "a:1").ok);
  EXPECT_TRUE(h.TakeSignals("a:1").empty());
  EXPECT_TRUE(h.Proc("a:1").held);
  h.ExecResult("a:1", true);
  EXPECT_EQ(h.TakeSignals("a:1"), std::vector<int>{SIGTERM});
  h.Killed("a:1", SIGTERM);
  EXPECT_EQ(h.State("a:1"), "EXITED");
  EXPECT_EQ(std::string(AttemptOutcomeName(h.Proc("a:1").last()->outcome)), "stopped by ctl");
  EXPECT_EQ(h.State("a:0"), "RUNNING") << "a stop by hand restarts nobody";
}

TEST(SupervisorCore, ADirectProcessIsRunningOnlyOnceItsExecSucceeded) {
  Harness h(Role("a", 1, ""));  // ready = none, no worker in between
  h.exec_pending_ = true;
  h.Start();
  EXPECT_EQ(h.State("a:0"), "STARTING");
  h.ExecResult("a:0", true);
  EXPECT_EQ(h.State("a:0"), "RUNNING");
  h.ExecResult("a:0", false, "late");  // an outcome already settled is not re-judged
  EXPECT_FALSE(h.Proc("a:0").last()->start_failed);
}

TEST(SupervisorCore, ReadinessTimeoutOfADirectProcessExits75) {
  Harness h(Role("a", 1, "ready = { mode = \"notify\", timeout = \"10s\" }"));
  h.Start();
  EXPECT_EQ(h.State("a:0"), "STARTING");
  h.Advance(Millis(9999));
  EXPECT_FALSE(h.core().stopping());
  h.Advance(Millis(1));
  EXPECT_TRUE(h.core().stopping());
  h.Killed("a:0", SIGTERM);
  EXPECT_EQ(h.core().ExitCode(), 75);
}

TEST(SupervisorCore, NotifyReadyMakesItRunning) {
  Harness h(Role("a", 1, "ready = { mode = \"notify\", timeout = \"10s\" }"));
  h.Start();
  NotifyFields r;
  r.ready = true;
  r.status = "step 1 loss 2.5";
  h.Report("a:0", r);
  EXPECT_EQ(h.State("a:0"), "RUNNING");
  EXPECT_EQ(h.core().Status().processes[0].status, "step 1 loss 2.5");
}

// --- watchdog ---

TEST(SupervisorCoreWatchdog, APingingProcessThatStopsIsHungKilledAndRestarted) {
  Harness h(Role("a", 1, kOnFailure3), [](RunConfig* c) { c->roles[0].watchdog = Millis(5000); });
  h.Start();
  NotifyFields ping;
  ping.watchdog = true;
  ping.main_pid = 77;
  h.Report("a:0", ping);
  h.Advance(Millis(4000));
  h.Report("a:0", ping);
  h.Advance(Millis(4000));
  EXPECT_TRUE(h.TakeSignals("a:0").empty()) << "it pinged in time";
  // Output is no progress once it promised WATCHDOG=1.
  h.core().OnOutput(h.Index("a:0"));
  h.Advance(Millis(1000));
  EXPECT_EQ(h.TakeSignals("a:0"), std::vector<int>{SIGABRT});
  EXPECT_EQ(h.State("a:0"), "STOPPING");
  h.Advance(Millis(2000));  // the stop grace: SIGKILL
  EXPECT_EQ(h.TakeSignals("a:0"), std::vector<int>{SIGKILL});
  h.Killed("a:0", SIGKILL);
  EXPECT_EQ(h.State("a:0"), "BACKOFF");
  EXPECT_TRUE(h.Proc("a:0").attempts[0].hung);
  EXPECT_NE(h.Proc("a:0").attempts[0].reason.find("hung"), std::string::npos);
  h.Advance(Millis(1000));
  EXPECT_EQ(h.Spawns("a:0"), 2);
}

TEST(SupervisorCoreWatchdog, WithoutPingsOutputIsProgress) {
  Harness h(Role("a", 1, kOnFailure3), [](RunConfig* c) { c->roles[0].watchdog = Millis(5000); });
  h.Start();
  for (int k = 0; k < 5; ++k) {
    h.Advance(Millis(4000));
    h.core().OnOutput(h.Index("a:0"));
  }
  EXPECT_TRUE(h.TakeSignals("a:0").empty());
  h.Advance(Millis(5000));
  EXPECT_EQ(h.TakeSignals("a:0"), std::vector<int>{SIGABRT});
}

// --- network probes: ready = tcp/http, liveness ---

const char* kHttpReady =
    "ready = { mode = \"http\", url = \"http://127.0.0.1:8080/health\", interval = \"500ms\", timeout = \"10s\" }";

TEST(SupervisorCoreProbe, ReadyOnlyAfterAnAnswerInTheSetTriedEveryInterval) {
  Harness h(Role("s", 1, kHttpReady));
  h.Start();
  h.Advance(Millis(0));
  std::vector<uint64_t> tries = h.TakeProbes("s:0");
  ASSERT_EQ(tries.size(), 1u) << "the first try at once";
  h.Advance(Millis(2000));
  EXPECT_TRUE(h.TakeProbes("s:0").empty()) << "one try at a time";
  h.Probed("s:0", tries[0], false, "HTTP 503 (wanted 2xx)");
  EXPECT_EQ(h.State("s:0"), "STARTING");
  h.Advance(Millis(499));
  EXPECT_TRUE(h.TakeProbes("s:0").empty()) << "the next try after the interval";
  EXPECT_EQ(h.core().NextDeadline(), h.now() + Millis(1));
  h.Advance(Millis(1));
  tries = h.TakeProbes("s:0");
  ASSERT_EQ(tries.size(), 1u);
  h.Probed("s:0", tries[0] - 1, true, "HTTP 200");  // an earlier try's late answer
  EXPECT_EQ(h.State("s:0"), "STARTING");
  h.Probed("s:0", tries[0], true, "HTTP 200");
  EXPECT_EQ(h.State("s:0"), "RUNNING");
  EXPECT_GT(h.Proc("s:0").attempts[0].ready_s, 0);
  bool said = false;
  for (const nlohmann::json& e : h.Events())
    if (e.value("to", "") == "RUNNING" && e.value("reason", "").find("HTTP 200") != std::string::npos) said = true;
  EXPECT_TRUE(said) << "the RUNNING event says what answered";
  h.Advance(Millis(5000));
  EXPECT_TRUE(h.TakeProbes("s:0").empty()) << "no liveness: no more tries once ready";
}

TEST(SupervisorCoreProbe, NotAnsweredInTimeFailsWithTheLastTry) {
  Harness h(Role("s", 1, kHttpReady));
  h.Start();
  for (int k = 0; k < 40 && h.State("s:0") == "STARTING"; ++k) {
    h.Advance(Millis(250));
    for (uint64_t t : h.TakeProbes("s:0")) h.Probed("s:0", t, false, "connection refused");
  }
  EXPECT_EQ(h.State("s:0"), "STOPPING");
  EXPECT_TRUE(h.Proc("s:0").attempts[0].ready_timeout);
  EXPECT_NE(h.core().stop_reason().find("never answered with 2xx; last try: connection refused"), std::string::npos)
      << h.core().stop_reason();
}

TEST(SupervisorCoreProbe, AnAnswerAfterTheProcessDiedDoesNotCount) {
  Harness h(Role("s", 1, std::string(kHttpReady) + "\n" + kOnFailure3));
  h.Start();
  h.Advance(Millis(0));
  std::vector<uint64_t> tries = h.TakeProbes("s:0");
  ASSERT_EQ(tries.size(), 1u);
  h.Probed("s:0", tries[0], false, "connection refused");
  h.Advance(Millis(500));
  tries = h.TakeProbes("s:0");
  ASSERT_EQ(tries.size(), 1u);
  h.Exit("s:0", 1);  // it died while the try was out
  h.Probed("s:0", tries[0], true, "HTTP 200");
  EXPECT_EQ(h.State("s:0"), "BACKOFF");
  const AttemptRecord& a = h.Proc("s:0").attempts[0];
  EXPECT_EQ(a.ready_s, 0);
  EXPECT_NE(a.reason.find("exited with code 1 before it was ready (ready = http: GET "
                          "http://127.0.0.1:8080/health never answered with 2xx; last try: connection refused)"),
            std::string::npos)
      << a.reason;
  h.Advance(Millis(1000));  // restarted per policy: its tries start again
  EXPECT_EQ(h.Spawns("s:0"), 2);
  h.Advance(Millis(0));
  tries = h.TakeProbes("s:0");
  ASSERT_EQ(tries.size(), 1u);
  h.Probed("s:0", tries[0], true, "HTTP 200");
  EXPECT_EQ(h.State("s:0"), "RUNNING");
}

TEST(SupervisorCoreProbe, LivenessFailuresInARowAreAHangHandledAsTheWatchdogs) {
  Harness h(Role("s", 1, std::string("liveness = { mode = \"tcp\", port = 8080, interval = \"1s\", failures = 3 }\n") +
                             kOnFailure3));
  h.Start();
  ASSERT_EQ(h.State("s:0"), "RUNNING");  // ready = none
  auto fail_once = [&](const char* what) {
    h.Advance(Millis(1000));
    std::vector<uint64_t> t = h.TakeProbes("s:0");
    ASSERT_EQ(t.size(), 1u);
    h.Probed("s:0", t[0], false, what);
  };
  fail_once("connection refused");
  fail_once("connection refused");
  h.Advance(Millis(1000));
  std::vector<uint64_t> t = h.TakeProbes("s:0");
  ASSERT_EQ(t.size(), 1u);
  h.Probed("s:0", t[0], true, "connected");  // an answer: the count starts again
  fail_once("no connect within 1s");
  fail_once("no connect within 1s");
  EXPECT_EQ(h.State("s:0"), "RUNNING");
  EXPECT_TRUE(h.TakeSignals("s:0").empty());
  fail_once("no connect within 1s");
  EXPECT_EQ(h.State("s:0"), "STOPPING");
  EXPECT_EQ(h.TakeSignals("s:0"), std::vector<int>{SIGABRT});
  h.Advance(Millis(1000));
  EXPECT_TRUE(h.TakeProbes("s:0").empty()) << "a hung process is not probed";
  h.Killed("s:0", SIGABRT);
  const AttemptRecord& a = h.Proc("s:0").attempts[0];
  EXPECT_TRUE(a.hung);
  EXPECT_EQ(std::string(AttemptOutcomeName(a.outcome)), "restarted");
  EXPECT_NE(a.reason.find("hung: liveness: 3 failed tries in a row of tcp 127.0.0.1:8080 (last: no connect within 1s)"),
            std::string::npos)
      << a.reason;
  EXPECT_EQ(h.State("s:0"), "BACKOFF");
}

TEST(SupervisorCoreProbe, LivenessTriesThatFailedWhileTheSupervisorWasStoppedDoNotCount) {
  Harness h(Role("s", 1, "liveness = { mode = \"tcp\", port = 8080, interval = \"1s\", failures = 2 }"));
  h.Start();
  h.Advance(Millis(1000));
  std::vector<uint64_t> t = h.TakeProbes("s:0");
  ASSERT_EQ(t.size(), 1u);
  h.Probed("s:0", t[0], false, "no connect within 1s");
  h.Paused(Millis(60000));
  h.Advance(Millis(1000));
  t = h.TakeProbes("s:0");
  ASSERT_EQ(t.size(), 1u);
  h.Probed("s:0", t[0], false, "no connect within 1s");
  EXPECT_EQ(h.State("s:0"), "RUNNING") << "the count began again after the pause";
}

TEST(SupervisorCoreStack, ANamedProbePortIsEachProcesssOwn) {
  Harness h(Role("server", 2, "ports = [\"admin\", \"http\"]\n"
                              "ready = { mode = \"http\", url = \"http://127.0.0.1:{http}/health\" }\n"
                              "liveness = { mode = \"tcp\", port = \"admin\" }"));
  const RoleSpec& role = h.plan().config.roles[0];
  ProcessPlan pp = h.plan().processes[1];
  pp.ports = {20001, 20002};
  ProbeSpec ready = ResolveProbe(role.ready.probe, role, pp);
  EXPECT_EQ(ready.port, 20002);
  EXPECT_EQ(ready.url, "http://127.0.0.1:20002/health");
  EXPECT_EQ(ready.Request().find("Host: 127.0.0.1:20002"), ready.Request().find("Host: "));
  ProbeSpec live = ResolveProbe(role.liveness.probe, role, pp);
  EXPECT_EQ(live.port, 20001);
  EXPECT_EQ(live.Describe(), "tcp 127.0.0.1:20001");
}

}  // namespace
}  // namespace dflash
