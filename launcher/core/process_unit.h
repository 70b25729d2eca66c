// One process of the run as a unit, as systemd's Service is one: its plan, its state, its attempts and its
// timers (stop grace, restart backoff, readiness, watchdog, probes), and every transition that touches nothing but
// it. What happens between units -- restart units and budgets, the start order, the incident, node rounds, ctl --
// is the core's (supervisor_core.h). A unit tells what it changed through its UnitSink: log lines, events.jsonl
// lines and the shell's actions, in the order it decided them.
#pragma once

#include <sys/types.h>

#include <algorithm>
#include <optional>
#include <string>
#include <vector>

#include "common/spawn.h"
#include "contract/readiness.h"
#include "launcher/plan/plan.h"
#include "launcher/core/attempt_record.h"
#include "launcher/core/core_action.h"
#include "launcher/core/restart_policy.h"
#include "worker/protocol.h"

namespace dflash {

/// kWaiting: not started yet (or not restarted yet), held until its role's warm-up has
/// compiled and the roles it starts after (`after`, services) are ready.
enum class ProcState { kNotStarted, kWaiting, kFailed, kStarting, kRunning, kBackoff, kStopping, kExited, kFatal };
/// The states as the console, events.jsonl, summary.json and `ctl status` spell them.
inline constexpr EnumName<ProcState> kProcStateNames[] = {
    {ProcState::kNotStarted, "NOT_STARTED"}, {ProcState::kWaiting, "WAITING"},   {ProcState::kFailed, "FAILED"},
    {ProcState::kStarting, "STARTING"},      {ProcState::kRunning, "RUNNING"},   {ProcState::kBackoff, "BACKOFF"},
    {ProcState::kStopping, "STOPPING"},      {ProcState::kExited, "EXITED"},     {ProcState::kFatal, "FATAL"},
};
const char* ProcStateName(ProcState s);

/// Why the supervisor is ending the current attempt, if it is: decides what its
/// exit means (a stop is no failure, a hang is one).
enum class EndIntent {
  kNone,     ///< it ends on its own: judged by its restart policy
  kStop,     ///< stopped (the run ends, or by hand): its end is no failure
  kRestart,  ///< stopped because its restart unit restarts (policy or by hand)
  kHung,     ///< its watchdog expired: a failure, reason "hung"
};

/// A process as everyone reads it: the core's table, the shell, `ctl status`, summary.json. Its ProcessUnit
/// alone writes it.
struct CoreProc {
  const ProcessPlan* plan = nullptr;
  bool direct = false;  ///< executed without dflash-worker (Plan::NeedsWorker)
  ProcState state = ProcState::kNotStarted;
  pid_t pid = -1;          ///< while it lives; -1 once reaped
  pid_t payload_pid = -1;  ///< MAINPID= from the worker, this attempt
  int attempt = -1;        ///< spawns so far - 1
  EndIntent intent = EndIntent::kNone;
  bool exec_pending = false;  ///< forked; whether its exec succeeded is not known yet
  /// A stop decided while exec_pending (`intent` is set): its signal waits for
  /// OnExecResult, since a failed exec is its own failure, not a stop. The why for STOPPING.
  std::optional<std::string> stop_after_exec;
  bool manual = false;        ///< the current stop/restart was asked by ctl
  bool held = false;          ///< stopped by hand: stays stopped until `ctl start`
  int ctl_signal = 0;         ///< the last signal `ctl signal` sent this attempt (0: none)
  bool stops_after_dependents = false;  ///< the run stops: its signal waits until what starts after it has ended
  std::string reason;         ///< how its last attempt ended (or why it never started): summary.json
  std::string why;            ///< why it is in its current state: the status view
  std::string status;         ///< its last STATUS=
  std::string worker_error, payload_exit;
  int payload_signal = 0;
  SteadyTime started{}, ended{};
  SteadyTime restart_at{};                    ///< BACKOFF: when it starts again
  SteadyTime kill_at = SteadyTime::max();     ///< STOPPING: SIGKILL then
  std::optional<Readiness> readiness;  ///< direct processes only: their readiness, judged here
  SteadyTime watchdog_at = SteadyTime::max(); ///< RUNNING with a watchdog: hung then
  bool watchdog_pings = false;                ///< it sent WATCHDOG=1 this attempt
  // Network probes (contract/probe_spec.h): ready = tcp/http while STARTING, liveness while RUNNING.
  SteadyTime probe_at = SteadyTime::max();  ///< the next try then (none out)
  /// Its role's ready and liveness probes with its own named port filled in (ResolveProbe).
  ProbeSpec ready_probe, live_probe;
  uint64_t probe_seq = 0;                   ///< the try out, if probe_out: its answer must carry this
  bool probe_out = false;                   ///< a kProbe was sent, OnProbeResult not yet
  int probe_failures = 0;                   ///< liveness: failed tries in a row
  std::string hung_why;                     ///< why it was judged hung: "no WATCHDOG=1 for 5m", "liveness: ..."
  int64_t memory_peak = -1;
  std::vector<AttemptRecord> attempts;
  AttemptFiles files;  ///< what its last ended attempt's files said (told by the shell: OnExit)

  AttemptRecord& current() { return attempts.back(); }
  const AttemptRecord* last() const { return attempts.empty() ? nullptr : &attempts.back(); }
  /// Its last attempt's gate facts (none before it first starts).
  const GateFacts& gate() const;
  bool alive() const { return pid > 0; }
};

/// `spec` of `role` for process `pp`: a named port (port = "http", url "...:{http}/...")
/// replaced by the port the process was given.
ProbeSpec ResolveProbe(const ProbeSpec& spec, const RoleSpec& role, const ProcessPlan& pp);

/// Where a unit's changes go: the core's one list of actions, in the order everything was decided.
class UnitSink {
 public:
  virtual void Emit(CoreAction a) = 0;
  /// Unit `i` entered another state (after its line and event).
  virtual void StateChanged(size_t i) = 0;
  /// The event's one "now" (SupervisorCore::EventTime), and seconds since the run began.
  virtual SteadyTime Now() const = 0;
  virtual double Since(SteadyTime t) const = 0;

 protected:
  ~UnitSink() = default;
};

/// A deadline of one unit that came due (ProcessUnit::TakeDue); the core decides what it means.
struct UnitDue {
  bool restart = false;        ///< BACKOFF is over: start it (or hold it) again
  bool ready_timeout = false;  ///< not ready in time (a direct process: a worker times its own payload)
  std::string hung;            ///< its watchdog expired: why, for Hang
};

class ProcessUnit {
 public:
  ProcessUnit(size_t index, const ProcessPlan& plan, const RoleSpec& role, bool direct, UnitSink* sink);

  const CoreProc& view() const { return p_; }
  const ProcessPlan& plan() const { return *p_.plan; }
  const RoleSpec& role() const { return role_; }
  size_t index() const { return index_; }
  const std::string& name() const { return p_.plan->name; }
  bool alive() const { return p_.alive(); }
  ProcState state() const { return p_.state; }
  EndIntent intent() const { return p_.intent; }
  bool held() const { return p_.held; }

  // --- its state and its record ---------------------------------------------------------------------------
  /// A transition: its log line and event; false (and nothing said) if it was in `s` already.
  bool Enter(ProcState s, const std::string& why = "");
  /// An event without a transition: a fact for the record (`by_hand`: asked by ctl).
  void Note(const std::string& why, bool by_hand = false);
  void SetReason(const std::string& why) { p_.reason = why; }
  /// The current attempt's outcome (and reason, if given).
  void SetOutcome(AttemptOutcome o);
  /// Its current attempt ended because its restart unit restarted (dflash_restarts_total's reason "unit").
  void MarkWithUnit() { p_.current().with_unit = true; }

  // --- a start ------------------------------------------------------------------------------------------
  /// A new attempt: its record, STARTING and kSpawn. `after_warmup`: it takes no gate of its own and starts on
  /// its role's warm-up's cache (kReuse if that published READY, kNone if not); nullopt: not so.
  void BeginAttempt(std::optional<GateRole> after_warmup);
  void Spawned(pid_t pid);
  /// It could not be forked (false: its end is judged now, with this reason), or (`pid` > 0) its exec failed
  /// at once and it exits 126/127 on its own (true: it will be reaped).
  bool SpawnFailed(const std::string& why, pid_t pid);
  /// Its exec's outcome; `ready`: running as soon as it runs (a direct process with ready = none); `stop`: a
  /// stop held back for it, to carry out now. Nothing if its outcome was settled already.
  struct ExecOutcome {
    bool settled = false;
    bool ready = false;
    std::optional<std::string> stop;
  };
  ExecOutcome SettleExec(bool ok, const std::string& err);

  // --- readiness, watchdog, probes -------------------------------------------------------------------------
  /// The probe it runs now (ready while STARTING, liveness while RUNNING), or nullptr.
  const ProbeSpec* ActiveProbe(bool stopping) const;
  /// A probe's answer; returns the why of readiness if that made it ready, or sets `hung` if liveness failed
  /// too often. Stale answers (an earlier try or attempt, a state that changed) count for nothing.
  std::optional<std::string> TakeProbe(uint64_t seq, bool answered, const std::string& detail, bool stopping,
                                       std::string* hung);
  /// STARTING -> RUNNING (`why`), its watchdog and liveness armed; false if it was not starting.
  bool BecomeRunning(const std::string& why);
  void ArmWatchdog();
  /// Output is progress only for a process that never promised WATCHDOG=1.
  void OnOutput();
  /// Its worker's (or its own) report: MAINPID=, errors, STATUS=, WATCHDOG=1.
  void TakeReport(const NotifyFields& r);
  /// The report's X_DFLASH_GATE_* facts into its current attempt (its gate state: a line and an event).
  void TakeGateFacts(const NotifyFields& r);
  /// Whether the report's READY=1 makes it ready now (a worker judged its payload; a direct process is judged
  /// here), and the why for RUNNING.
  std::optional<std::string> ReadyFrom(const NotifyFields& r);
  /// Not ready within ready.timeout: its record says so; returns why, in words ("(pid N) not ready within ...").
  std::string ReadyTimedOut();
  const Readiness* readiness() const { return p_.readiness ? &*p_.readiness : nullptr; }

  // --- stopping -------------------------------------------------------------------------------------------
  /// Stop this attempt (`intent`: what its end means). Settles its exec first where that is pending. Does
  /// nothing if it is not alive, already stopping or restarting, or failed to exec.
  void Stop(EndIntent intent, const std::string& why);
  /// Its signal and STOPPING, once its exec is known to have succeeded.
  void SignalStop(const std::string& why);
  /// Judged hung: the watchdog signal to its payload (its stacks), SIGKILL after the grace.
  void Hang(const std::string& why);
  /// A ctl `signal` by hand: sent, and a fact for the record.
  void SignalByHand(int sig);
  /// The intent of a stop under way changes: a hang or a restart becomes a stop, a stop a restart.
  void SetIntent(EndIntent intent) { p_.intent = intent; }
  /// The run stops, but its signal waits until what starts after it has ended (or not, `wait` false).
  void WaitForDependents(bool wait) { p_.stops_after_dependents = wait; }

  // --- restarts and holds ----------------------------------------------------------------------------------
  void SetRestartAt(SteadyTime at) { p_.restart_at = at; }
  /// A restart by its policy: the attempt's outcome (CountRestarts counts it), when it starts again.
  void CountRestart(SteadyTime at);
  /// A restart or stop asked by ctl: its end is then by hand (kRestartedByCtl, kStoppedByCtl), never a failure.
  void MarkManual();
  void Hold() { p_.held = true; }
  void Release() { p_.held = false; }
  void NoteMemoryPeak(int64_t bytes) { p_.memory_peak = std::max(p_.memory_peak, bytes); }

  // --- time -----------------------------------------------------------------------------------------------
  /// What came due by `now`: SIGKILL after the grace and a probe's next try are carried out here; the rest is
  /// handed back for the core to decide.
  UnitDue TakeDue(SteadyTime now, bool stopping);
  /// Its probe's next try, if due by `now` (after the core has judged the rest of what came due).
  void ProbeIfDue(SteadyTime now, bool stopping);
  /// The earliest of its deadlines (SteadyTime::max(): none).
  SteadyTime NextDeadline(bool stopping) const;
  /// Whether it is being timed now (a grace, a readiness timeout, a watchdog, liveness).
  bool Timed() const;
  /// `lost` passed unseen: grace and readiness postponed by it, watchdog and liveness re-armed from now.
  void GiveBack(SteadyTime::duration lost);

  // --- the run's moves, on this unit (process_unit_ends.cc) ------------------------------------------------
  /// Its restart unit restarts at `at` (`why`): alive, it is stopped for it (a hang's stop becomes the restart);
  /// ended, it waits in BACKOFF until then (the later restart, if it waits already). WAITING or held by ctl:
  /// untouched (it starts when its warm-up is done, or at `ctl start`).
  void RestartWithUnit(SteadyTime at, const std::string& why);
  /// The run stops: alive, it is stopped (a restart under way becomes the stop), or, with `live_dependents`, its
  /// signal waits for them (a server outlives its clients); a BACKOFF ends; one never started says why
  /// (`why_held`: what held it in WAITING, "" if nothing).
  void StopWithRun(bool live_dependents, const std::string& why_held);
  /// Ended (`how`) because its restart unit restarts: BACKOFF until the restart.
  void EndForRestart(const std::string& how);
  /// Ended (`how`) while the run stops, or stopped by us: a failure to start is its own failure; else stopped by
  /// hand, collateral (`blamed_elsewhere`: a culprit other than it came first, here or on another node), or stopped.
  void EndWhileStopping(bool blamed_elsewhere, const std::string& how);
  /// Ended (`how`) by a stop asked by hand otherwise than by `ctl stop` (`why`: a stop signal `ctl signal` sent
  /// to it or to a peer of its world): held as if by `ctl stop`, no failure.
  void EndStoppedByHand(const std::string& why, const std::string& how);
  /// Its end (`how`) as a service's: a service runs until the run ends, so any end before that, 0 included, is a
  /// failure; true (and `how` and its record say so) if it was one that ended 0.
  bool ServiceEndedEarly(std::string* how);
  /// Its end (`how`), not restarted by its policy (`d`: kNoRestart or kExhausted): a success (EXITED; returns "")
  /// or a failure, its outcome recorded (failed, hung, fatal: `*fatal`); returns that failure's reason.
  std::string EndByPolicy(const RestartDecision& d, bool service_ended, const std::string& how, bool* fatal);
  /// Ended (`how`) and restarted by its policy (`reason`), its unit with it: counted, BACKOFF until `at`; in a
  /// store-mode round (`round`) held until the round starts it.
  void EndForOwnRestart(SteadyTime at, const std::string& how, const std::string& reason, bool round);
  /// A warm-up that failed (`how`): FATAL for its role, and its failure in words, with where its log is (`log`).
  std::string EndWarmupFailed(const std::string& how, const std::string& log);
  /// The run stops and its signal waited for what starts after it: they have ended (`live_dependents` false), so
  /// it is stopped now.
  void StopOnceDependentsEnded(bool live_dependents);
  /// A warm-up ended 0: EXITED, and whether its role's READY is there (published by it, or there already).
  bool EndWarmup();
  /// The run's end is blamed on its failure (`reason`); ended, it enters FATAL (`fatal`), FAILED (it never
  /// started) or EXITED.
  void EndFailed(const std::string& reason, bool fatal);

  // --- its end --------------------------------------------------------------------------------------------
  /// Reaped: its record closed (exit code, signal, what its files said), and how it ended, in words, as its record
  /// and summary.json say it (the worker's words for its payload, the error file, a readiness it never reached, a
  /// hang).
  std::string EndAttempt(const ExitStatus& st, AttemptFiles files);
  /// How its last attempt ended, said again (with what the core judged of it).
  void Reword(const std::string& how);

 private:
  void Event(ProcState from, ProcState to, const std::string& why);
  void Info(const std::string& text) { sink_->Emit(CoreAction::Log(text)); }
  void Warn(const std::string& text) { sink_->Emit(CoreAction::Log(text, true)); }

  size_t index_;
  const RoleSpec& role_;
  UnitSink* sink_;
  CoreProc p_;
};

}  // namespace dflash
