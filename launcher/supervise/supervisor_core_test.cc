// The supervisor's decisions with a fake clock and no processes: every spawn
// gets a made-up pid, every exit is an event we send.
#include "launcher/supervise/supervisor_core.h"
#include "launcher/supervise/supervisor_summary.h"

#include <gtest/gtest.h>

#include "testing/enum_names_check.h"

#include <csignal>
#include <fstream>
#include <sstream>

namespace dflash {
namespace {

class Harness {
 public:
  /// `toml` is a config body; [run] log_dir and cache_dir are added.
  explicit Harness(const std::string& toml, const std::function<void(RunConfig*)>& tweak = nullptr) {
    std::string text = "[run]\nname = \"t\"\nlog_dir = \"/tmp/dflash-core-test\"\ncache_dir = \"/tmp/dflash-core-test/c\"\n" + toml;
    RunConfig c;
    std::vector<ConfigError> errors;
    EXPECT_TRUE(LoadConfigFromString(text, "/tmp/core_test.toml", &c, &errors)) << FormatErrors(errors);
    if (tweak) tweak(&c);
    PlanOptions po;
    po.bin_dir = "/opt/dflash/bin";
    po.run_id = "t-1";
    po.torch_version = [](const RoleSpec&) { return std::string("2.13.0+cpu"); };
    plan_ = BuildPlan(c, po);
    core_ = std::make_unique<SupervisorCore>(plan_, [this] {
      SteadyTime t = now_;
      if (tick_per_read_) now_ += Millis(1);  // a clock that moves while the core decides
      return t;
    });
  }

  SupervisorCore& core() { return *core_; }
  const Plan& plan() const { return plan_; }

  size_t Index(const std::string& name) const {
    for (size_t i = 0; i < core_->size(); ++i)
      if (core_->proc(i).plan->name == name) return i;
    ADD_FAILURE() << "no process " << name;
    return 0;
  }
  const CoreProc& Proc(const std::string& name) const { return core_->proc(Index(name)); }
  std::string State(const std::string& name) const { return ProcStateName(Proc(name).state); }

  /// Carries out the core's actions like the shell would: each spawn succeeds.
  void Pump() {
    while (core_->HasActions()) {
      for (const CoreAction& a : core_->TakeActions()) {
        actions_.push_back(a);
        if (a.kind == CoreAction::Kind::kSpawn) {
          ++spawns_[a.index];
          if (spawn_fails_) core_->OnSpawnFailed(a.index, "fork: no", 1);
          else core_->OnSpawned(a.index, next_pid_++, exec_pending_);
        }
        if (a.kind == CoreAction::Kind::kSettleExec && settle_)
          core_->OnExecResult(a.index, settle_->first, settle_->second);
      }
    }
  }
  void Start() {
    core_->Start();
    Pump();
  }
  void Exit(const std::string& name, int code) {
    ExitStatus st;
    st.exited = true;
    st.code = code;
    core_->OnExit(Index(name), st, "");
    Pump();
  }
  void Killed(const std::string& name, int sig) {
    ExitStatus st;
    st.signaled = true;
    st.signal = sig;
    core_->OnExit(Index(name), st, "");
    Pump();
  }
  void Advance(Millis d) {
    now_ += d;
    core_->OnTick();
    Pump();
  }
  void Report(const std::string& name, const NotifyFields& r) {
    core_->OnReport(Index(name), r);
    Pump();
  }
  ControlReply Ctl(ControlVerb verb, const std::string& target, int sig = 0) {
    ControlRequest req;
    req.verb = verb;
    req.target = target;
    req.signal = sig;
    ControlReply r = core_->Apply(req);
    Pump();
    return r;
  }
  int Spawns(const std::string& name) { return spawns_[Index(name)]; }
  /// Signals sent to `name` since the last call (kill: SIGKILL).
  std::vector<int> TakeSignals(const std::string& name) {
    std::vector<int> out;
    size_t i = Index(name);
    for (const CoreAction& a : actions_) {
      if (a.index != i) continue;
      if (a.kind == CoreAction::Kind::kSignal) out.push_back(a.signal);
      if (a.kind == CoreAction::Kind::kKill) out.push_back(SIGKILL);
    }
    actions_.erase(std::remove_if(actions_.begin(), actions_.end(),
                                  [&](const CoreAction& a) {
                                    return a.index == i && (a.kind == CoreAction::Kind::kSignal ||
                                                            a.kind == CoreAction::Kind::kKill);
                                  }),
                   actions_.end());
    return out;
  }
  std::vector<nlohmann::json> Events() const {
    std::vector<nlohmann::json> out;
    for (const CoreAction& a : actions_)
      if (a.kind == CoreAction::Kind::kEvent) out.push_back(a.event);
    return out;
  }
  /// Every action taken so far, in the order the core queued them.
  const std::vector<CoreAction>& Actions() const { return actions_; }
  /// Actions of `kind` since the start (their index), e.g. the rounds asked for.
  std::vector<size_t> Taken(CoreAction::Kind kind) const {
    std::vector<size_t> out;
    for (const CoreAction& a : actions_)
      if (a.kind == kind) out.push_back(a.index);
    return out;
  }
  /// One turn of the shell's loop in which the supervisor was stopped for
  /// `d`: it asked to wake by NextWake, woke `d` later, then judged.
  void Paused(Millis d) {
    SteadyTime began = now_, asked = core_->NextWake(now_);
    now_ += d;
    core_->OnLoopTurn(began, asked, now_);
    core_->OnTick();
    Pump();
  }
  /// A turn that woke exactly when it asked to (or at `now_` + `d` if sooner).
  void Turn(Millis d) {
    SteadyTime began = now_, asked = core_->NextWake(now_);
    now_ = std::min(asked, now_ + d);
    core_->OnLoopTurn(began, asked, now_);
    core_->OnTick();
    Pump();
  }
  SteadyTime now() const { return now_; }
  /// The probe tries asked for `name` since the last call (their seq), taken.
  std::vector<uint64_t> TakeProbes(const std::string& name) {
    std::vector<uint64_t> out;
    size_t i = Index(name);
    for (auto it = actions_.begin(); it != actions_.end();) {
      if (it->kind == CoreAction::Kind::kProbe && it->index == i) {
        out.push_back(it->seq);
        it = actions_.erase(it);
      } else {
        ++it;
      }
    }
    return out;
  }
  void Probed(const std::string& name, uint64_t seq, bool answered, const std::string& detail) {
    core_->OnProbeResult(Index(name), seq, answered, detail);
    Pump();
  }
  bool spawn_fails_ = false;
  bool tick_per_read_ = false;
  /// Spawns whose exec outcome comes later (ExecResult), as the shell reports a direct payload's.
  bool exec_pending_ = false;
  void ExecResult(const std::string& name, bool ok, const std::string& err = "") {
    core_->OnExecResult(Index(name), ok, err);
    Pump();
  }
  /// How many log lines so far contain `text`.
  int Said(const std::string& text) const {
    int n = 0;
    for (const CoreAction& a : actions_)
      if (a.kind == CoreAction::Kind::kLog && a.text.find(text) != std::string::npos) ++n;
    return n;
  }
  /// How many warnings so far contain `text`.
  int Warned(const std::string& text) const {
    int n = 0;
    for (const CoreAction& a : actions_)
      if (a.kind == CoreAction::Kind::kLog && a.warn && a.text.find(text) != std::string::npos) ++n;
    return n;
  }
  /// A stop that needs the outcome now asks the shell (kSettleExec); this harness answers `ok`/`err`
  /// at once, like the shell. Without it, kSettleExec stays unanswered until ExecResult.
  void SettleExecAs(bool ok, const std::string& err = "") { settle_.emplace(ok, err); }

 private:
  Plan plan_;
  SteadyTime now_ = SteadyTime{} + std::chrono::hours(1);
  std::unique_ptr<SupervisorCore> core_;
  std::vector<CoreAction> actions_;
  std::optional<std::pair<bool, std::string>> settle_;
  std::map<size_t, int> spawns_;
  pid_t next_pid_ = 1000;
};

std::string Role(const std::string& name, int cpu, const std::string& extra) {
  return "[[role]]\nname = \"" + name + "\"\ncpu = " + std::to_string(cpu) + "\ncommand = [\"sleep\", \"1000\"]\n" +
         extra + "\n";
}

const char* kOnFailure3 =
    "restart = { policy = \"on-failure\", max = 3, window = \"1h\", backoff = \"1s..4s\" }\n"
    "stop = { signal = \"SIGTERM\", grace = \"2s\" }";

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

TEST(SupervisorCore, SuccessAfterRestartsSaysTheRestartsInTheOneVerdict) {
  Harness h(Role("a", 2, kOnFailure3));
  h.Start();
  h.Exit("a:1", 3);
  h.Advance(Millis(1500));  // its backoff: 1s
  EXPECT_EQ(h.State("a:1"), "RUNNING");
  h.Exit("a:0", 0);
  h.Exit("a:1", 0);
  ASSERT_TRUE(h.core().Done());
  const std::string said = "all processes succeeded (after 1 restart: a:1 1x)";
  EXPECT_EQ(h.core().ExitCode(), 0);
  EXPECT_EQ(h.core().ExitReason(), said);
  RunSummary s = BuildRunSummary(h.core(), 1.0, "");  // summary.json and the table's last line say the same
  EXPECT_EQ(s.reason, said);
  EXPECT_NE(SummaryTable(s, false).find("run t-1: " + said + " (1.0s)"), std::string::npos) << SummaryTable(s, false);
}

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
  EXPECT_EQ(h.Proc("a:0").restarts, 2);
  ASSERT_EQ(h.Proc("a:0").attempts.size(), 3u);
  EXPECT_EQ(std::string(AttemptOutcomeName(h.Proc("a:0").attempts[0].outcome)), "restarted");
  EXPECT_EQ(h.Proc("a:0").attempts[0].exit_code, 1);
}

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
  EXPECT_EQ(h.core().culprit_attempt()->attempt, 3) << "the same process failing again: its last failure";
  EXPECT_EQ(h.core().ExitReason().rfind("a:0 exited with code 7; restart budget exhausted", 0), 0u)
      << h.core().ExitReason();
  EXPECT_EQ(std::string(AttemptOutcomeName(h.Proc("b:0").last()->outcome)), "collateral");
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
  h.core().StopForNode("node 1: b:0", "node 1 failed: b:0 exited with code 3");
  h.Pump();
  EXPECT_TRUE(h.core().Done());
  EXPECT_EQ(h.core().ExitCode(), 70);
  EXPECT_EQ(h.core().ExitReason(), "node 1 failed: b:0 exited with code 3");
  EXPECT_EQ(h.core().culprit(), -1);
}

TEST(SupervisorCore, AnotherNodesFailureIsTheSummarysCulpritWithItsRecord) {
  Harness h(Role("a", 1, kOnFailure3));
  h.Start();
  nlohmann::json record = {{"node", 1}, {"process", "b:0"}, {"exit_code", 3}, {"reason", "exited with code 3"}};
  h.core().StopForNode("node 1: b:0", "node 1 failed: b:0 exited with code 3", 70, record);
  h.core().StopForNode("node 2: c:0", "node 2 failed", 70, {{"node", 2}});  // stopping already: the first one stays
  h.Pump();
  h.Killed("a:0", SIGTERM);
  ASSERT_TRUE(h.core().Done());
  RunSummary s = BuildRunSummary(h.core(), 1.0, "");
  EXPECT_EQ(s.culprit, "node 1: b:0");
  EXPECT_EQ(s.node_culprit, record);
  EXPECT_EQ(s.exit_code, 70);
  EXPECT_TRUE(s.processes[0].collateral);
  nlohmann::ordered_json j = SummaryJson(s);
  EXPECT_EQ(j["culprit"], "node 1: b:0");
  EXPECT_EQ(j["node_culprit"]["process"], "b:0");
  EXPECT_TRUE(j["culprit_attempt"].is_null()) << "no attempt of this node is the culprit";
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
  EXPECT_EQ(h.core().culprit_attempt()->attempt, 0);
  EXPECT_EQ(h.core().ExitCode(), 3);
  EXPECT_NE(h.core().ExitReason().find("drafter:1 exited with code 3"), std::string::npos) << h.core().ExitReason();
  EXPECT_NE(h.core().ExitReason().find("target:1"), std::string::npos) << h.core().ExitReason();
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

TEST(SupervisorCore, ASpawnThatFailsIsAFailureOfItsOwn) {
  Harness h(Role("a", 1, ""));
  h.spawn_fails_ = true;
  h.Start();
  EXPECT_EQ(h.State("a:0"), "FAILED");
  EXPECT_TRUE(h.core().Done());
  EXPECT_EQ(h.core().ExitCode(), 1);
  EXPECT_TRUE(h.Proc("a:0").last()->start_failed);
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
  EXPECT_EQ(h.Proc("a:1").restarts, 1) << "its failure counts against the budget, as a stop for a restart does not";
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
  EXPECT_EQ(h.Proc("a:1").restarts, 0) << "stopped for its unit's restart: not its failure";
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

TEST(SupervisorCoreControl, StoppingTheLastRankByHandSaysSoAndStopAllNamesIt) {
  Harness h(Role("a", 3, kOnFailure3));
  h.Start();
  h.Exit("a:0", 0);
  h.Exit("a:2", 0);
  ASSERT_TRUE(h.Ctl(ControlVerb::kStop, "a:1").ok);  // the hung last rank
  h.Killed("a:1", SIGTERM);
  EXPECT_FALSE(h.core().Done()) << "held: the run stays up, by design";
  EXPECT_EQ(h.Said("nothing is running: what is left was stopped by ctl"), 1);
  h.Advance(Millis(1000));
  EXPECT_EQ(h.Said("nothing is running"), 1) << "said once";
  ASSERT_TRUE(h.Ctl(ControlVerb::kStop, "all").ok);
  EXPECT_TRUE(h.core().Done());
  EXPECT_EQ(h.core().ExitCode(), 0);  // docs/exit-codes.md: 0 after `ctl stop all` when nothing failed
  EXPECT_EQ(h.core().ExitReason(), "stopped by ctl (stop all); stopped by ctl before it finished: a:1");
  std::string table = SummaryTable(BuildRunSummary(h.core(), 1.0, ""), /*color=*/false);
  EXPECT_EQ(table.find("all processes succeeded"), std::string::npos) << table;
  EXPECT_NE(table.find("stopped by ctl before it finished: a:1"), std::string::npos) << table;
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

}  // namespace
}  // namespace dflash

namespace dflash {
namespace {

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

TEST(SupervisorCoreSummary, AGateFactItsLauncherDoesNotKnowIsAWarningNotAString) {
  Harness h(Role("d", 1, "gate = { mode = \"serial\" }"));
  h.Start();
  // What another dflash-worker version might send: decoded at the protocol boundary like any datagram.
  h.Report("d:0", DecodeNotify("X_DFLASH_GATE_KEY=k\nX_DFLASH_GATE_ROLE=leader\nX_DFLASH_GATE_CLUSTER=elected\n"
                               "X_DFLASH_GATE_STATE=leading"));
  EXPECT_EQ(h.Warned("d:0 reported the gate fact X_DFLASH_GATE_ROLE=leader, which this launcher does not know"), 1);
  EXPECT_EQ(h.Warned("X_DFLASH_GATE_CLUSTER=elected"), 1);
  const GateFacts& g = h.Proc("d:0").gate();
  EXPECT_FALSE(g.role) << "no role is better than a guessed one";
  EXPECT_FALSE(g.cluster);
  EXPECT_EQ(g.key, "k");
  EXPECT_EQ(g.state, GateState::kLeading) << "the facts it knows are kept";
  h.Report("d:0", DecodeNotify("X_DFLASH_GATE_ROLE=lead\nBARRIER=1"));
  EXPECT_EQ(h.Proc("d:0").gate().role, GateRole::kLead);
  EXPECT_EQ(h.Warned("BARRIER"), 0) << "only gate facts are the gate's business";
}

TEST(SupervisorCoreSummary, EveryAttemptKeepsItsOwnGateFacts) {
  // A leader that crashed mid-compile, then reused what a peer published: summary.json says both.
  Harness h(Role("d", 1, "gate = { mode = \"serial\" }\nrestart = { policy = \"on-failure\", max = 3, backoff = \"1s..1s\" }"));
  h.Start();
  NotifyFields lead;
  lead.gate_role = GateRole::kLead;
  lead.gate_state = GateState::kLeading;
  h.Report("d:0", lead);
  h.Killed("d:0", SIGSEGV);
  h.Advance(Millis(1000));
  ASSERT_EQ(h.Spawns("d:0"), 2);
  EXPECT_TRUE(h.Proc("d:0").gate().empty()) << "a new attempt starts with no gate facts";
  NotifyFields reuse;
  reuse.gate_role = GateRole::kReuse;
  reuse.gate_state = GateState::kReusing;
  reuse.gate_wait_s = 4.0;
  h.Report("d:0", reuse);
  h.Exit("d:0", 0);
  RunSummary s = BuildRunSummary(h.core(), 1.0, "");
  ASSERT_EQ(s.processes.size(), 1u);
  const ProcessSummary& d = s.processes[0];
  ASSERT_EQ(d.attempts.size(), 2u);
  EXPECT_EQ(d.attempts[0].gate.role, GateRole::kLead);
  EXPECT_EQ(d.attempts[0].gate.state, GateState::kLeading);
  EXPECT_FALSE(d.attempts[0].gate.wait_s);
  EXPECT_EQ(d.attempts[1].gate.role, GateRole::kReuse);
  EXPECT_EQ(d.attempts[1].gate.wait_s, 4.0);
  EXPECT_EQ(d.gate, d.attempts[1].gate) << "the process's gate is its last attempt's";
  nlohmann::ordered_json j = SummaryJson(s);
  EXPECT_EQ(j["processes"][0]["attempts"][0]["gate"]["role"], "lead");
  EXPECT_EQ(j["processes"][0]["attempts"][1]["gate"]["role"], "reuse");
}

/// A run with every gate fact the worker reports: a cluster leader, a follower, a leader that fetched
/// another node's kernels after a local fallback crashed, and a role started on its warm-up's cache.
RunSummary GatedRunSummary(std::vector<nlohmann::json>* events = nullptr) {
  Harness h(Role("d", 3, "gate = { mode = \"serial\" }\nrestart = { policy = \"on-failure\", max = 3, backoff = \"1s..1s\" }") +
            Role("w", 2, "gate = { mode = \"warmup\" }\nrestart = { policy = \"never\" }"));
  h.Start();
  NotifyFields warm;
  warm.gate_key = "w-key";
  warm.gate_role = GateRole::kLead;
  warm.gate_state = GateState::kReady;
  warm.gate_compile_s = 7.25;
  warm.gate_precompiled = false;
  warm.gate_precompile = "off (gate.precompile = false)";
  h.Report("w:warmup", warm);
  h.Exit("w:warmup", 0);
  NotifyFields lead;
  lead.gate_key = "d-key";
  lead.gate_role = GateRole::kLead;
  lead.gate_state = GateState::kLeading;
  lead.gate_wait_s = 0.004;
  lead.gate_cluster = ClusterOutcome::kLeader;
  lead.gate_cluster_token = 3;
  h.Report("d:0", lead);
  NotifyFields published;
  published.gate_state = GateState::kReady;
  published.gate_compile_s = 31.2;
  published.gate_published_bytes = 248832;
  published.gate_precompiled = true;
  published.gate_precompile = "saved";
  published.gate_dynamo_hits = 0;
  published.ready = true;
  published.ready_s = 31.5;
  h.Report("d:0", published);
  NotifyFields reuse;
  reuse.gate_key = "d-key";
  reuse.gate_role = GateRole::kReuse;
  reuse.gate_state = GateState::kReusing;
  reuse.gate_wait_s = 30.125;
  reuse.gate_precompiled = true;
  reuse.gate_precompile = "dynamo cache hit";
  reuse.gate_dynamo_hits = 1;
  reuse.ready = true;
  reuse.ready_s = 2.5;
  h.Report("d:1", reuse);
  NotifyFields fallback;
  fallback.gate_key = "d-key";
  fallback.gate_role = GateRole::kLead;
  fallback.gate_state = GateState::kLeading;
  fallback.gate_cluster = ClusterOutcome::kLocalFallback;
  h.Report("d:2", fallback);
  h.Killed("d:2", SIGSEGV);
  h.Advance(Millis(1000));
  NotifyFields fetched;
  fetched.gate_key = "d-key";
  fetched.gate_role = GateRole::kLead;
  fetched.gate_state = GateState::kLeading;
  fetched.gate_wait_s = 1.5;
  fetched.gate_cluster = ClusterOutcome::kFetched;
  fetched.gate_fetch_bytes = 248832;
  fetched.gate_fetch_s = 0.25;
  h.Report("d:2", fetched);
  for (const char* n : {"d:0", "d:1", "d:2", "w:0", "w:1"}) h.Exit(n, 0);
  EXPECT_TRUE(h.core().Done());
  if (events) *events = h.Events();
  return BuildRunSummary(h.core(), 40.5, "");
}

std::string Golden(const std::string& name) {
  std::ifstream in(std::string(DFLASH_SOURCE_DIR) + "/launcher/supervise/testdata/" + name);
  EXPECT_TRUE(in) << name;
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

/// A warm-up-mode role of one process whose warm-up published: "w:0" then runs as a direct process.
const char* kWarmupRoleOfOne = "gate = { mode = \"warmup\" }\nrestart = { policy = \"never\" }";

void WarmUp(Harness* h) {
  h->Start();
  NotifyFields warm;
  warm.gate_key = "w-key";
  warm.gate_role = GateRole::kLead;
  warm.gate_state = GateState::kReady;
  h->Report("w:warmup", warm);
  h->Exit("w:warmup", 0);
}

NotifyFields PrecompileFacts(bool precompiled, const std::string& why, bool ready = false) {
  NotifyFields f;
  f.gate_precompiled = precompiled;
  f.gate_precompile = why;
  f.ready = ready;
  return f;
}

/// What summary.json says of w:0's precompile once it exited.
std::pair<std::optional<bool>, std::optional<std::string>> W0Precompile(Harness* h) {
  h->Exit("w:0", 0);
  RunSummary s = BuildRunSummary(h->core(), 1.0, "");
  for (const ProcessSummary& p : s.processes)
    if (p.name == "w:0") return {p.gate.precompiled, p.gate.precompile};
  ADD_FAILURE() << "no w:0";
  return {};
}

TEST(SupervisorCoreSummary, ADirectProcessesPrecompileFactsAreThoseItHadAtReady) {
  // A warm-up-mode process reports its own facts (the payload hook sends them at each load and compile, without
  // READY): the last before READY stands, and a compile after READY does not rewrite it.
  Harness h(Role("w", 1, kWarmupRoleOfOne));
  WarmUp(&h);
  h.Report("w:0", PrecompileFacts(false, "dynamo cache miss: no entry for this code"));
  h.Report("w:0", PrecompileFacts(true, "dynamo cache hit", /*ready=*/true));
  h.Report("w:0", PrecompileFacts(false, "dynamo cache hit, but this process compiled graphs anyway"));
  auto [precompiled, why] = W0Precompile(&h);
  EXPECT_EQ(precompiled, true);
  EXPECT_EQ(why, "dynamo cache hit");
}

TEST(SupervisorCoreSummary, ADirectProcessesFirstPrecompileFactsAreTakenEvenAfterItsReady) {
  // Its READY (a log line on its stdout) and the datagram sent before it come on different fds: the supervisor
  // may read the line first. Facts it had not had yet are taken; a second word after READY is not.
  Harness h(Role("w", 1, kWarmupRoleOfOne));
  WarmUp(&h);
  NotifyFields ready;
  ready.ready = true;
  h.Report("w:0", ready);
  h.Report("w:0", PrecompileFacts(true, "dynamo cache hit"));
  h.Report("w:0", PrecompileFacts(false, "dynamo cache hit, but this process compiled graphs anyway"));
  auto [precompiled, why] = W0Precompile(&h);
  EXPECT_EQ(precompiled, true);
  EXPECT_EQ(why, "dynamo cache hit");
}

TEST(SupervisorCoreSummary, GateFactsReachSummaryJsonEventsAndTheTableAsTheyAlwaysWere) {
  // summary.json and events.jsonl are read by tools outside this repo: for a run with every gate fact, their
  // bytes are pinned (launcher/supervise/testdata/gated_run.*; a deliberate change of format rewrites them).
  std::vector<nlohmann::json> events;
  RunSummary s = GatedRunSummary(&events);
  EXPECT_EQ(SummaryJson(s).dump(1) + "\n", Golden("gated_run.summary.json"));
  EXPECT_EQ(SummaryTable(s, /*color=*/false), Golden("gated_run.table.txt"));
  std::string lines;
  for (const nlohmann::json& e : events)
    if (e.contains("gate")) lines += e.dump() + "\n";
  EXPECT_EQ(lines, Golden("gated_run.events.jsonl"));
}

}  // namespace
}  // namespace dflash

namespace dflash {
namespace {

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

namespace dflash {
namespace {

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
