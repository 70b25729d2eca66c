// The supervisor's core driven by hand, for the tests of its parts (launcher/core/*_test.cc) and of the summary
// it feeds (launcher/supervise/supervisor_summary_test.cc): a fake clock, a made-up pid for every spawn, every
// exit an event the test sends, the core's actions carried out as the shell would.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <csignal>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "launcher/config/config.h"
#include "launcher/core/restart_count.h"
#include "launcher/core/supervisor_core.h"
#include "launcher/plan/plan.h"

namespace dflash::core_test {

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
    // A fixed CPU: the derived keys the golden files record must not depend on the host's.
    po.host_cpu = ParseCpuInfo("vendor_id : GenuineIntel\ncpu family : 6\nmodel : 143\nflags : avx2 fma\n", "x86_64");
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
  /// The culprit's attempt that was the root cause (the core's own: SupervisorCore keeps it private).
  const AttemptRecord* CulpritAttempt() const { return core_->culprit_attempt(); }
  /// Its restarts as `ctl status` and the summary count them.
  RestartCounts Restarts(const std::string& name) const { return CountRestarts(Proc(name).attempts); }
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
  /// `files`: what its attempt's files said, as the shell tells it when it reaps one.
  void Exit(const std::string& name, int code, AttemptFiles files = {}) {
    ExitStatus st;
    st.exited = true;
    st.code = code;
    core_->OnExit(Index(name), st, std::move(files));
    Pump();
  }
  void Killed(const std::string& name, int sig, AttemptFiles files = {}) {
    ExitStatus st;
    st.signaled = true;
    st.signal = sig;
    core_->OnExit(Index(name), st, std::move(files));
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

/// The units of `plan` as the core makes them, without a core: for the tests of one part on units alone. What
/// they emit is kept (`actions`); `now` is every event's time.
class LoneUnits : private UnitSink {
 public:
  explicit LoneUnits(const Plan& plan) {
    for (const auto* list : {&plan.processes, &plan.warmups})
      for (const ProcessPlan& pp : *list)
        units.emplace_back(units.size(), pp, plan.RoleOf(pp), !plan.NeedsWorker(pp), static_cast<UnitSink*>(this));
  }
  LoneUnits(const LoneUnits&) = delete;
  LoneUnits& operator=(const LoneUnits&) = delete;
  std::vector<ProcessUnit> units;
  std::vector<CoreAction> actions;
  SteadyTime now = SteadyTime{} + std::chrono::hours(1);
  /// Actions of `kind` emitted so far.
  int Count(CoreAction::Kind kind) const {
    return static_cast<int>(std::count_if(actions.begin(), actions.end(), [&](const CoreAction& a) { return a.kind == kind; }));
  }

 private:
  void Emit(CoreAction a) override { actions.push_back(std::move(a)); }
  void StateChanged(size_t) override {}
  SteadyTime Now() const override { return now; }
  double Since(SteadyTime) const override { return 0; }
};

inline std::string Role(const std::string& name, int cpu, const std::string& extra) {
  return "[[role]]\nname = \"" + name + "\"\ncpu = " + std::to_string(cpu) + "\ncommand = [\"sleep\", \"1000\"]\n" +
         extra + "\n";
}

inline const char* kOnFailure3 =
    "restart = { policy = \"on-failure\", max = 3, window = \"1h\", backoff = \"1s..4s\" }\n"
    "stop = { signal = \"SIGTERM\", grace = \"2s\" }";

}  // namespace dflash::core_test
