// The supervisor's decisions, with no process, fd or clock of its own. It routes each event from the epoll
// shell (launcher/supervise/supervisor.cc) to the parts that decide, and collects their actions for the shell:
//   ProcessUnit (process_unit.h)   one per process: its state, attempts, timers and transitions;
//   StartOrder (start_order.h)     warm-up holds, `after`, services, the reverse order of a stop;
//   Incident (incident.h)          the culprit and the one verdict of the run;
//   NodeRounds (node_rounds.h)     store-mode restart rounds;  ControlVerbs (control_verbs.h)  ctl's verbs;
//   RestartUnits (restart_units.h) which processes restart together, from which budget;
//   GuardianRestarts (restart_policy.h) dflash-guardian's budget;
// and itself, what spans units: which part an event is for, what an end means (supervisor_exits.cc), the run's
// stop and its readiness, time it did not see.
// A clock it is given; unit-tested with a fake clock and no processes (supervisor_core_test.cc).
#pragma once

#include <sys/types.h>

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/exit_codes.h"
#include "common/spawn.h"
#include "contract/pause.h"
#include "launcher/control/control.h"
#include "launcher/plan/plan.h"
#include "launcher/core/control_verbs.h"
#include "launcher/core/incident.h"
#include "launcher/core/node_culprit.h"
#include "launcher/core/node_rounds.h"
#include "launcher/core/process_unit.h"
#include "launcher/core/restart_policy.h"
#include "launcher/core/restart_units.h"
#include "launcher/core/run_summary.h"
#include "launcher/core/start_order.h"
#include "launcher/core/unit_table.h"
#include "worker/protocol.h"

namespace dflash {

namespace core_test {
class Harness;
}

/// A process as the shell reads it (launcher/supervise): what it needs to carry actions out, reap, measure and
/// log, copied out of the core's table. The table itself (CoreProc, process_unit.h) is the core's alone.
struct ProcView {
  const ProcessPlan* plan = nullptr;  ///< its plan: name, role, ports, attempt paths
  ProcState state = ProcState::kNotStarted;
  pid_t pid = -1;          ///< while it lives; -1 once reaped
  pid_t payload_pid = -1;  ///< MAINPID= of this attempt (a claim checked when made), or -1
  int attempt = -1;        ///< spawns so far - 1
  bool exec_pending = false;  ///< forked; whether its exec succeeded is not known yet
  SteadyTime started{};       ///< when this attempt began
  pid_t last_pid = -1;        ///< its last attempt's pid, ended or not (-1: never started)
  int last_exit_code = -1;    ///< its last ended attempt's, shell style; -1: none ended
  GateFacts gate;             ///< its last attempt's gate facts
  std::vector<const char*> restart_reasons;  ///< why each restart (restart_count.h RestartReasons)
  bool alive() const { return pid > 0; }
};

class SupervisorCore final : public ControlHandler, private UnitSink, private UnitTable {
 public:
  using Clock = std::function<SteadyTime()>;
  /// `clock` is steady_clock::now in the shell, a fake in tests.
  SupervisorCore(const Plan& plan, Clock clock);
  ~SupervisorCore() override;

  // --- events -------------------------------------------------------------
  /// Warm-ups first; roles held for one wait, the others start at once.
  void Start();
  /// The shell forked proc `i` as `pid`; `exec_pending`: its exec outcome comes later.
  void OnSpawned(size_t i, pid_t pid, bool exec_pending);
  /// It could not even be forked (or, `pid` > 0, its exec failed at once and it
  /// exits 126/127 on its own: it will be reaped).
  void OnSpawnFailed(size_t i, const std::string& why, int exit_code, pid_t pid = -1);
  /// Its exec succeeded (ok) or failed (`err`: it exits 126/127 on its own).
  /// Also the answer to kSettleExec: a stop held back for it is carried out
  /// now if it succeeded, and dropped if it failed. An outcome already known is not re-judged.
  void OnExecResult(size_t i, bool ok, const std::string& err);
  /// Reaped; `files`: what its attempt's error file (TORCHELASTIC_ERROR_FILE) and metrics file said, read once by
  /// the shell now (the end's words, and the summary's facts: nothing reads them again).
  void OnExit(size_t i, const ExitStatus& st, AttemptFiles files = {});
  void OnReport(size_t i, const NotifyFields& report);
  /// A try of kProbe `seq` for proc `i` ended: `answered` and what it saw, as
  /// contract/probe_spec.h JudgeProbe says. A stale answer (an earlier try, an
  /// attempt that ended) is dropped; the shell settles a dead process's exit
  /// first, so an answer that came after the process died never counts.
  void OnProbeResult(size_t i, uint64_t seq, bool answered, const std::string& detail);
  /// It wrote output: progress for a watchdog that has no WATCHDOG=1 pings.
  void OnOutput(size_t i);
  /// SIGINT/SIGTERM/SIGHUP stop the run (twice: kill at once); others are forwarded.
  void OnSignal(int sig);
  /// Deadlines due by now. The shell first takes what is queued (datagrams,
  /// pipes, exits): a ping that arrived before the verdict counts.
  void OnTick();
  /// One turn of the shell's loop: it began waiting at `wait_began`, asked to
  /// wake by `asked` (SteadyTime::max(): no limit) and woke at `woke`. A
  /// wake-up or a turn much later than that is time the supervisor did not
  /// see (it was stopped, frozen or starved): OnPaused. Call before OnTick.
  void OnLoopTurn(SteadyTime wait_began, SteadyTime asked, SteadyTime woke);
  /// `lost` passed while the supervisor could not look: whatever it judges by
  /// time gets that time back (docs/design.md, "Time that did not pass"):
  /// readiness and stop grace are postponed by `lost`, watchdogs re-armed
  /// from now, since the payload may have been stopped with us.
  void OnPaused(SteadyTime::duration lost);
  /// The loop itself broke (epoll failed): kill everything.
  void Abort(const std::string& why);
  void AddWarning(const std::string& warning);
  /// dflash-guardian (`how`: "(pid N) was killed by SIGKILL") died before the
  /// run ended. True: the shell starts a new one. False: it died too often
  /// (GuardianRestarts, restart_policy.h) and the run stops.
  bool OnGuardianDied(const std::string& how);
  /// No guardian can be had (`why`): the run stops with that reason, exit 1.
  void StopUnguarded(const std::string& why);
  bool unguarded() const { return incident_.unguarded(); }
  /// [run] stop_signals: besides SIGINT, SIGTERM and SIGHUP, signals that stop the run (a preemption notice).
  std::vector<int> stop_signals;
  void NoteMemoryPeak(size_t i, int64_t bytes);

  // --- nodes (a coordination store, docs/multinode.md) ----------------------
  /// Set by the shell when a store coordinates several nodes: a restart wider than
  /// one process (scope "role"/"all", or a torch world) is then a round of every
  /// node (kRoundRequest) instead of a restart of this node's processes alone.
  bool node_rounds = false;
  /// Round `round` began (any node asked): stop every process for it, hold them,
  /// and say kRoundStopped once none is left running.
  void BeginRound(int round, const std::string& why);
  /// Every node stopped for `round`: start every held process again (after the
  /// backoff of the failure that asked for the round, if later).
  void StartRound(int round);
  /// The run stops because of another node (its failure, its launcher lost, the
  /// store lost): `stop.culprit` is who (the verdict names it: "node 1 (launcher lost)"),
  /// `stop.exit_code` the run's (kNodeFailed: another node failed; kDeposed: this node was left behind),
  /// `stop.record` that failure as the store had it (summary.json's node_culprit). Once the
  /// run is stopping, it changes nothing: the first reason to stop is the culprit.
  void StopForNode(NodeStop stop);
  int round() const { return rounds_.round(); }

  // --- control (launcher/control/control.h) ---------------------------------------
  RunStatus Status() override;
  ControlReply Apply(const ControlRequest& request) override;
  /// Set by the shell: run id, dir, supervisor pid go into Status().
  RunStatus status_base;

  // --- queries --------------------------------------------------------------
  std::vector<CoreAction> TakeActions();
  bool HasActions() const { return !actions_.empty(); }
  bool Done() const;
  SteadyTime NextDeadline() const;
  /// When the loop must wake at the latest: NextDeadline(), or `now` +
  /// kPauseProbe (contract/pause.h) while a watchdog, readiness or stop grace is being timed.
  SteadyTime NextWake(SteadyTime now) const;
  /// Pauses noticed so far and the time they took (summary, tests).
  int pauses() const { return pauses_; }
  double paused_s() const { return paused_s_; }
  /// The process whose worker (or payload) sent a datagram, or -1.
  int FindSender(pid_t pid, pid_t pgid) const;
  size_t size() const { return units_.size(); }
  /// Process `i` as the shell reads it (a copy: call again after an event to see its effect).
  ProcView view(size_t i) const;
  /// The process the run's end is blamed on (-1: none), and that failure in words (its attempt's reason).
  int culprit() const { return incident_.culprit(); }
  std::string CulpritReason() const;
  bool stopping() const override { return incident_.stopping(); }
  const std::string& stop_reason() const override { return incident_.stop_reason(); }
  /// The processes restarted together with `i` (RestartUnits::Members).
  std::vector<size_t> RestartUnit(size_t i) const override { return restarts_.Members(i); }
  /// The processes of `i`'s torch world (RestartUnits::World).
  std::vector<size_t> TorchWorldOf(size_t i) const override { return restarts_.World(i); }
  /// How the run ended, as everyone says it (Incident::Verdict, with each attempt's training as the shell told
  /// it, and the records' loss if told); `start_error`: the loop never started.
  RunVerdict Verdict(const std::string& start_error = "") const;
  /// The run's own records are incomplete (`what`: supervisor.log lines lost to a full disk): a fact for the
  /// verdict, told before the summary is built (RunVerdict::RecordsIncomplete).
  void RecordsIncomplete(const std::string& what);
  /// The run's summary, built once (run_summary.cc) from the core's table, the facts the shell told it and the
  /// verdict; `wall_s`: the run's wall time, `start_error`: the loop never started.
  RunSummary Summary(double wall_s, const std::string& start_error = "") const;
  /// The verdict's exit code and reason.
  int ExitCode() const { return Verdict().exit_code; }
  std::string ExitReason() const { return Verdict().reason; }

 private:
  friend class core_test::Harness;  // reads the table itself (CoreProc) in the core's own tests
  const CoreProc& proc(size_t i) const { return units_[i].view(); }
  const AttemptRecord* culprit_attempt() const { return incident_.culprit_attempt(); }

  // UnitSink and UnitTable: what the units and the policies ask of the core.
  void Emit(CoreAction a) override { actions_.push_back(std::move(a)); }
  void StateChanged(size_t i) override;
  SteadyTime Now() const override { return event_now_ ? *event_now_ : clock_(); }
  double Since(SteadyTime t) const override;
  std::vector<ProcessUnit>& units() override { return units_; }
  void StartOrHold(size_t i, const std::string& prefix) override;
  void StopByHand(const std::string& reason) override;

  void Spawn(size_t i);
  /// OnExit's judgement of one end: outcome, restart, failure.
  void JudgeExit(size_t i, const ExitStatus& st, AttemptFiles files);
  /// A restart by policy: its unit (or, in store mode, a round of every node) starts again.
  void Restart(size_t i, const RestartDecision& d, const std::string& how);
  void Fail(size_t i, const std::string& reason, bool fatal);
  /// A signal that asks a process of `i`'s role to stop: its stop.signal, or one that stops the run (SIGINT,
  /// SIGTERM, SIGHUP, [run] stop_signals).
  bool IsStopSignal(size_t i, int sig) const;
  /// `i` ended by a stop signal that `ctl signal` sent to it or to a peer of its torch world this attempt: that
  /// stop in words ("SIGTERM sent to drafter:1 by ctl; ..."); "" when its end was no stop asked by hand.
  std::string StopAskedOfWorld(size_t i) const;
  void BeginStop(const std::string& reason);
  void MarkReady(size_t i, const std::string& why);
  void OnWarmupExit(size_t i, const std::string& how);
  void Hang(size_t i, const std::string& why);
  void NoteFailure(size_t i) { incident_.NoteFailure(i, Now(), RestartUnit(i)); }
  /// Starts every WAITING process nothing holds any longer.
  void StartReleased();
  /// The run stops: signals the deferred processes whose dependents have all ended.
  void ContinueStop();
  void Info(const std::string& text) { Emit(CoreAction::Log(text)); }
  void Warn(const std::string& text) { Emit(CoreAction::Log(text, true)); }
  bool Timing() const;

  /// One "now" per event: every decision an event leads to is judged at the same
  /// instant (its events, deadlines and records agree). Public entry points open an
  /// EventTime; Now() outside one reads the clock afresh.
  class EventTime {
   public:
    explicit EventTime(const SupervisorCore* core) : core_(core), outer_(!core->event_now_) {
      if (outer_) core_->event_now_ = core_->clock_();
    }
    ~EventTime() {
      if (outer_) core_->event_now_.reset();
    }
    EventTime(const EventTime&) = delete;
    EventTime& operator=(const EventTime&) = delete;

   private:
    const SupervisorCore* core_;
    bool outer_;
  };

  const Plan& plan_;
  Clock clock_;
  mutable std::optional<SteadyTime> event_now_;
  std::vector<ProcessUnit> units_;  // the role processes, then the warm-ups
  std::vector<CoreAction> actions_;
  std::vector<std::string> warnings_;
  RestartUnits restarts_{plan_, units_};
  Incident incident_{units_};
  StartOrder order_{plan_, units_};
  NodeRounds rounds_{this};
  ControlVerbs control_{this};
  SteadyTime t0_{};
  bool started_ = false;
  bool told_ready_ = false;
  int interrupts_ = 0;
  GuardianRestarts guardian_;
  SteadyTime last_woke_{};  ///< the previous OnLoopTurn's `woke` (epoch: none yet)
  int pauses_ = 0;
  double paused_s_ = 0;
  std::string records_error_;  ///< RecordsIncomplete's, for the verdict
};

}  // namespace dflash
