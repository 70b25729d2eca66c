// StartOrder through the core (core_test_harness.h): warm-ups that hold their role, `after` and services
// (docs/stacks.md), the reverse stop.
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

TEST(SupervisorCoreWarmup, TheRoleWaitsForItsWarmupThenStartsOnTheWarmCache) {
  Harness h(Role("d", 2, "gate = true\nrestart = { policy = \"on-failure\", max = 3, backoff = \"1s..1s\" }"));
  ASSERT_EQ(h.plan().warmups.size(), 1u);
  h.Start();
  EXPECT_EQ(h.Spawns("d:warmup"), 1);
  EXPECT_EQ(h.State("d:0"), "WAITING");
  EXPECT_EQ(h.State("d:1"), "WAITING");
  EXPECT_EQ(h.Spawns("d:0"), 0);
  // A restart by hand of a waiting process does not start it early.
  ControlReply r = h.Ctl(ControlVerb::kRestart, "d");
  ASSERT_TRUE(r.ok);
  EXPECT_EQ(h.Spawns("d:0"), 0);
  EXPECT_FALSE(h.Ctl(ControlVerb::kStop, "d:warmup").ok) << "warm-ups are not controlled by hand";
  NotifyFields g;
  g.gate_role = GateRole::kLead;
  g.gate_state = GateState::kReady;
  g.gate_compile_s = 12.0;
  h.Report("d:warmup", g);
  h.Exit("d:warmup", 0);
  EXPECT_EQ(h.Spawns("d:0"), 1);
  EXPECT_EQ(h.Spawns("d:1"), 1);
  EXPECT_EQ(h.Proc("d:0").gate().role, GateRole::kReuse);
  EXPECT_TRUE(h.Proc("d:0").gate().warmup_mode);
}

TEST(SupervisorCoreWarmup, HoldOneHoldsOnlyTheFirstProcessOfADeclaredWorld) {
  // The others start with the warm-up; the held first one keeps the world's
  // rendezvous from completing until the cache is warm.
  Harness h(Role("d", 3, "gate = { hold = \"one\" }\nworld = \"role\"\nrestart = { policy = \"never\" }"));
  h.Start();
  EXPECT_EQ(h.Spawns("d:warmup"), 1);
  EXPECT_EQ(h.State("d:0"), "WAITING");
  EXPECT_EQ(h.Spawns("d:1"), 1);
  EXPECT_EQ(h.Spawns("d:2"), 1);
  h.Exit("d:warmup", 0);
  EXPECT_EQ(h.Spawns("d:0"), 1);
  EXPECT_EQ(h.Spawns("d:1"), 1) << "started once, never again";
}

TEST(SupervisorCoreWarmup, HoldAllIsTheDefaultEvenForADeclaredWorld) {
  Harness h(Role("d", 2, "gate = true\nworld = \"role\"\nrestart = { policy = \"never\" }"));
  h.Start();
  EXPECT_EQ(h.State("d:0"), "WAITING");
  EXPECT_EQ(h.State("d:1"), "WAITING");
  h.Exit("d:warmup", 0);
  EXPECT_EQ(h.Spawns("d:0"), 1);
  EXPECT_EQ(h.Spawns("d:1"), 1);
}

TEST(SupervisorCoreWarmup, AFailedWarmupFailsTheRunAndItsRoleNeverStarts) {
  Harness h(Role("d", 2, "gate = true") + Role("t", 1, ""));
  h.Start();
  EXPECT_EQ(h.Spawns("t:0"), 1) << "other roles never wait for a warm-up";
  h.Exit("d:warmup", 2);
  EXPECT_EQ(h.State("d:warmup"), "FATAL");
  EXPECT_EQ(h.State("d:0"), "NOT_STARTED");
  h.Killed("t:0", SIGTERM);
  EXPECT_TRUE(h.core().Done());
  EXPECT_EQ(h.core().ExitCode(), 2);
  EXPECT_EQ(h.Spawns("d:0"), 0);
}

// --- stacks: `after` and services (docs/stacks.md) ---

const char* kNotify = "ready = { mode = \"notify\", timeout = \"1h\" }\n";

void Ready(Harness& h, const std::string& name) {
  NotifyFields r;
  r.ready = true;
  h.Report(name, r);
}

/// The index in `ev` of the first event of `process` going to `to` (-1: none).
int FirstEvent(const std::vector<nlohmann::json>& ev, const std::string& process, const std::string& to) {
  for (size_t k = 0; k < ev.size(); ++k)
    if (ev[k]["process"] == process && ev[k]["to"] == to) return static_cast<int>(k);
  return -1;
}

TEST(SupervisorCoreStack, ARoleStartsOnlyOnceEveryProcessOfWhatItIsAfterIsReady) {
  Harness h(Role("target", 2, kNotify) + Role("drafter", 1, "after = [\"target\"]"));
  h.Start();
  EXPECT_EQ(h.State("target:0"), "STARTING");
  EXPECT_EQ(h.State("drafter:0"), "WAITING");
  EXPECT_EQ(h.Proc("drafter:0").why, "until target is ready");
  Ready(h, "target:0");
  EXPECT_EQ(h.Spawns("drafter:0"), 0) << "target:1 is not ready yet";
  Ready(h, "target:1");
  EXPECT_EQ(h.Spawns("drafter:0"), 1);
  EXPECT_EQ(h.State("drafter:0"), "RUNNING");
  std::vector<nlohmann::json> ev = h.Events();
  EXPECT_LT(FirstEvent(ev, "target:1", "RUNNING"), FirstEvent(ev, "drafter:0", "STARTING"));
}

TEST(SupervisorCoreStack, ARestartWaitsAgainForWhatItIsAfterWhileItRestarts) {
  std::string restart = "restart = { policy = \"on-failure\", max = 3, window = \"1h\", backoff = \"1s..1s\" }\n";
  Harness h(Role("target", 1, kNotify + restart) + Role("drafter", 1, "after = [\"target\"]\n" + restart));
  h.Start();
  Ready(h, "target:0");
  ASSERT_EQ(h.State("drafter:0"), "RUNNING");
  h.Exit("target:0", 1);
  EXPECT_EQ(h.State("drafter:0"), "RUNNING") << "a running dependent is no restart unit of its dependency";
  h.Exit("drafter:0", 1);  // it lost its server
  h.Advance(Millis(1000));
  EXPECT_EQ(h.State("target:0"), "STARTING");
  EXPECT_EQ(h.State("drafter:0"), "WAITING");
  EXPECT_EQ(h.Proc("drafter:0").why, "restarts until target is ready");
  EXPECT_EQ(h.Spawns("drafter:0"), 1);
  Ready(h, "target:0");
  EXPECT_EQ(h.Spawns("drafter:0"), 2);
  EXPECT_EQ(h.State("drafter:0"), "RUNNING");
}

TEST(SupervisorCoreStack, AStopRunsInReverseOrderEachWithItsGrace) {
  std::string grace = "stop = { signal = \"SIGTERM\", grace = \"5s\" }\n";
  Harness h(Role("store", 1, "service = true\n" + grace) + Role("target", 1, grace) +
            Role("drafter", 2, "after = [\"target\"]\n" + grace));
  h.Start();
  ASSERT_EQ(h.State("drafter:1"), "RUNNING");
  h.core().OnSignal(SIGTERM);
  h.Pump();
  EXPECT_EQ(h.State("drafter:0"), "STOPPING");
  EXPECT_EQ(h.State("drafter:1"), "STOPPING");
  EXPECT_EQ(h.State("target:0"), "RUNNING");
  EXPECT_EQ(h.State("store:0"), "RUNNING");
  EXPECT_TRUE(h.TakeSignals("target:0").empty());
  h.Killed("drafter:0", SIGTERM);
  EXPECT_EQ(h.State("target:0"), "RUNNING") << "drafter:1 still runs";
  h.Advance(Millis(5000));  // drafter:1 ignores SIGTERM: its grace ends in SIGKILL
  EXPECT_EQ(h.TakeSignals("drafter:1"), (std::vector<int>{SIGTERM, SIGKILL}));
  h.Killed("drafter:1", SIGKILL);
  EXPECT_EQ(h.State("target:0"), "STOPPING");
  EXPECT_EQ(h.State("store:0"), "RUNNING") << "services stop last";
  h.Killed("target:0", SIGTERM);
  EXPECT_EQ(h.State("store:0"), "STOPPING");
  EXPECT_EQ(h.TakeSignals("store:0"), std::vector<int>{SIGTERM});
  h.Killed("store:0", SIGTERM);
  EXPECT_TRUE(h.core().Done());
  EXPECT_EQ(h.core().ExitCode(), 128 + SIGTERM);
}

TEST(SupervisorCoreStack, WhatStartsAfterAFailedDependencyIsNeverStarted) {
  Harness h(Role("target", 1, kNotify) + Role("drafter", 2, "after = [\"target\"]"));
  h.Start();
  h.Exit("target:0", 3);  // before it was ready, policy never: failed for good
  EXPECT_EQ(h.State("drafter:0"), "NOT_STARTED");
  EXPECT_EQ(h.Proc("drafter:1").why, "not started: the run stopped before target is ready");
  EXPECT_EQ(h.Spawns("drafter:0"), 0);
  EXPECT_TRUE(h.core().Done());
  EXPECT_EQ(h.core().ExitCode(), 3);
  EXPECT_EQ(h.core().culprit(), static_cast<int>(h.Index("target:0")));
}

TEST(SupervisorCoreStack, AJobThatEndsZeroReleasesWhatStartsAfterIt) {
  Harness h(Role("prepare", 1, kNotify) + Role("train", 1, "after = [\"prepare\"]"));
  h.Start();
  EXPECT_EQ(h.State("train:0"), "WAITING");
  h.Exit("prepare:0", 0);
  EXPECT_EQ(h.State("train:0"), "RUNNING");
}

TEST(SupervisorCoreStack, TheRunEndsWhenTheRolesAreDoneThenTheServicesStop) {
  Harness h(Role("store", 1, "service = true\n" + std::string(kNotify)) + Role("job", 2, ""));
  h.Start();
  EXPECT_EQ(h.State("job:0"), "WAITING") << "a role that is not a service starts after every service";
  Ready(h, "store:0");
  ASSERT_EQ(h.State("job:1"), "RUNNING");
  h.Exit("job:0", 0);
  EXPECT_EQ(h.State("store:0"), "RUNNING");
  h.Exit("job:1", 0);
  EXPECT_EQ(h.State("store:0"), "STOPPING");
  h.Killed("store:0", SIGTERM);
  EXPECT_TRUE(h.core().Done());
  EXPECT_EQ(h.core().ExitCode(), 0);
  EXPECT_EQ(h.core().culprit(), -1);
  EXPECT_EQ(std::string(AttemptOutcomeName(h.Proc("store:0").last()->outcome)), "stopped");
  EXPECT_NE(h.core().ExitReason().find("services were stopped"), std::string::npos) << h.core().ExitReason();
}

TEST(SupervisorCoreStack, AServiceThatEndsZeroBeforeTheRunIsAFailure) {
  Harness h(Role("store", 1, "service = true") + Role("job", 1, ""));
  h.Start();
  h.Exit("store:0", 0);
  EXPECT_EQ(h.core().culprit(), static_cast<int>(h.Index("store:0")));
  EXPECT_EQ(h.State("job:0"), "STOPPING");
  h.Killed("job:0", SIGTERM);
  EXPECT_EQ(h.core().ExitCode(), 1);
  EXPECT_NE(h.core().ExitReason().find("a service must run until the run ends"), std::string::npos)
      << h.core().ExitReason();
}

TEST(SupervisorCoreStack, AServiceThatEndsZeroIsRestartedByOnFailure) {
  Harness h(Role("store", 1, "service = true\n" + std::string(kOnFailure3)) + Role("job", 1, ""));
  h.Start();
  h.Exit("store:0", 0);
  EXPECT_EQ(h.State("store:0"), "BACKOFF");
  EXPECT_EQ(std::string(AttemptOutcomeName(h.Proc("store:0").last()->outcome)), "restarted");
  h.Advance(Millis(1000));
  EXPECT_EQ(h.Spawns("store:0"), 2);
  EXPECT_FALSE(h.core().stopping());
}

TEST(SupervisorCoreStack, CtlStartOfAStoppedDependentWaitsForItsDependency) {
  Harness h(Role("target", 1, kNotify) + Role("drafter", 1, "after = [\"target\"]"));
  h.Start();
  ASSERT_TRUE(h.Ctl(ControlVerb::kStart, "drafter").ok);
  EXPECT_EQ(h.Spawns("drafter:0"), 0);
  EXPECT_EQ(h.State("drafter:0"), "WAITING");
  Ready(h, "target:0");
  EXPECT_EQ(h.Spawns("drafter:0"), 1);
}

}  // namespace
}  // namespace dflash
