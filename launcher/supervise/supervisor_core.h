// The supervisor's decisions, with no process, fd or clock of its own: the
// process table, each process's attempts, restart units and budgets, the
// culprit rule, deadlines (stop grace, readiness, restart backoff, watchdog),
// the warm-up hold and the live-control verbs. Driven by events from the epoll
// shell (launcher/supervise/supervisor.cc) and a clock it is given; answers with actions
// the shell carries out. Unit-tested with a fake clock and no processes
// (supervisor_core_test.cc).
#pragma once

#include <sys/types.h>

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/spawn.h"
#include "contract/pause.h"
#include "contract/readiness.h"
#include "launcher/control/control.h"
#include "launcher/plan/plan.h"
#include "launcher/supervise/attempt_record.h"
#include "launcher/supervise/restart_policy.h"
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

/// One process: its plan, its state and its attempts.
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
  bool stops_after_dependents = false;  ///< the run stops: its signal waits until what starts after it has ended
  int restarts = 0;           ///< restarts by policy
  int manual_restarts = 0;    ///< restarts asked by hand
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

  AttemptRecord& current() { return attempts.back(); }
  const AttemptRecord* last() const { return attempts.empty() ? nullptr : &attempts.back(); }
  /// Its last attempt's gate facts (none before it first starts).
  const GateFacts& gate() const;
  bool alive() const { return pid > 0; }
};

/// What the shell must do, in order.
struct CoreAction {
  enum class Kind {
    kSpawn,          ///< start proc `index` (attempt already counted); answer OnSpawned/OnSpawnFailed
    kSignal,         ///< `signal` to its process group (and its payload's, under a worker, if `payload`)
    kKill,           ///< SIGKILL its process group and its payload's
    kEnded,          ///< it was reaped: kill what it left behind (cgroup leaf, groups, orphans)
    kKillAll,        ///< SIGKILL everything of the run now (second Ctrl-C, epoll failure)
    kTellSystemd,    ///< `text` to the supervisor's own NOTIFY_SOCKET
    kLog,            ///< `text` for supervisor.log and the console (`warn`: a warning)
    kEvent,          ///< one line of events.jsonl (`event`, without its wall time)
    kCheckReuse,     ///< proc `index` reused a gate and is ready: did it hit the cache?
    kRoundRequest,   ///< nodes: ask every node for the round after round `index` (`text`: why)
    kRoundStopped,   ///< nodes: every process here has stopped for round `index`
    kProbe,          ///< one try of `probe` for proc `index`; answer OnProbeResult with `seq`
    kSettleExec,     ///< a stop of proc `index` waits for its exec outcome: read it now, answer OnExecResult
    kStatusText,     ///< proc `index` said STATUS=`text`: its log line and the console's status (shown once)
  };
  Kind kind = Kind::kLog;
  size_t index = 0;
  int signal = 0;
  bool payload = false;
  bool warn = false;
  std::string text;
  nlohmann::json event;
  const ProbeSpec* probe = nullptr;  ///< kProbe: what to try (the plan's, lives as long as the run)
  uint64_t seq = 0;                  ///< kProbe: handed back with the answer
};

/// `spec` of `role` for process `pp`: a named port (port = "http", url "...:{http}/...")
/// replaced by the port the process was given.
ProbeSpec ResolveProbe(const ProbeSpec& spec, const RoleSpec& role, const ProcessPlan& pp);

class SupervisorCore final : public ControlHandler {
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
  /// Reaped; `error_message` is its TORCHELASTIC_ERROR_FILE's message, if any.
  void OnExit(size_t i, const ExitStatus& st, const std::string& error_message);
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
  /// (more than kGuardianRestarts times within kGuardianWindow) and the run
  /// stops, since a run nobody can clean up after must not go on.
  bool OnGuardianDied(const std::string& how);
  /// No guardian can be had (`why`): the run stops with that reason, exit 1.
  void StopUnguarded(const std::string& why);
  static constexpr int kGuardianRestarts = 3;
  static constexpr Millis kGuardianWindow{60000};
  bool unguarded() const { return unguarded_; }
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
  /// store lost): `culprit` names it ("node 1 (launcher lost)"), the exit is kNodeFailed.
  /// `exit_code`: the run's (70: another node failed; 76: this node was left behind).
  /// `record`: that failure as the store had it (summary.json's node_culprit). Once the
  /// run is stopping, it changes nothing: the first reason to stop is the culprit.
  void StopForNode(const std::string& culprit, const std::string& reason, int exit_code = 70,
                   nlohmann::json record = nullptr);
  int round() const { return round_; }
  /// Another node whose failure stopped the run, or "": summary.json's culprit (named
  /// over a failure here that came after it; one before would have stopped the run).
  const std::string& node_culprit() const { return node_culprit_; }
  const nlohmann::json& node_record() const { return node_record_; }

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
  size_t size() const { return procs_.size(); }
  const CoreProc& proc(size_t i) const { return procs_[i]; }
  const std::vector<CoreProc>& procs() const { return procs_; }
  const Plan& plan() const { return plan_; }
  /// The process the run's end is blamed on (-1: none), and that failure.
  int culprit() const { return culprit_; }
  const AttemptRecord* culprit_attempt() const;
  bool stopping() const { return stopping_; }
  int stop_signal() const { return stop_signal_; }
  const std::string& stop_reason() const { return stop_reason_; }
  const std::vector<std::string>& warnings() const { return warnings_; }
  SteadyTime started_at() const { return t0_; }
  /// The processes restarted together with `i` (its unit, `i` included):
  /// scope, widened to the torch world it shares (RoleSpec::world).
  std::vector<size_t> RestartUnit(size_t i) const;
  /// The run's exit code and reason as summary.json states them.
  int ExitCode() const;
  std::string ExitReason() const;

 private:
  void Spawn(size_t i);
  /// OnReport's X_DFLASH_GATE_* facts into proc `i`'s current attempt (its gate state: a line and an event).
  void TakeGateFacts(size_t i, const NotifyFields& report);
  /// OnExit's judgement of one end: outcome, restart, failure.
  void JudgeExit(size_t i, const ExitStatus& st, const std::string& error_message);
  void SetState(size_t i, ProcState s, const std::string& why = "");
  void SayIfOnlyHeldAreLeft();
  void Event(size_t i, ProcState from, ProcState to, const std::string& why);
  void Fail(size_t i, const std::string& reason, bool fatal);
  void StopProc(size_t i, EndIntent intent, const std::string& why);
  /// StopProc's second half, once its exec is known to have succeeded: the stop signal and STOPPING.
  void SignalStop(size_t i, const std::string& why);
  void BeginStop(const std::string& reason);
  void MarkReady(size_t i, const std::string& why);
  void OnWarmupExit(size_t i, const std::string& how);
  void ScheduleRestart(size_t i, SteadyTime at, const std::string& why);
  void Hang(size_t i, const std::string& why);
  void ArmWatchdog(size_t i);
  /// The probe proc `i` runs now (ready while STARTING, liveness while RUNNING), or nullptr.
  const ProbeSpec* ActiveProbe(size_t i) const;
  void NoteFailure(size_t i);
  void MaybeCloseIncident();
  bool HeldForWarmup(size_t i) const;
  /// The first role `i` starts after whose processes here are not all ready, or "".
  std::string UnreadyDependency(size_t i) const;
  /// Why `i` may not start now ("" : it may): its warm-up or a dependency.
  std::string WhyHeld(size_t i) const;
  /// Starts, or holds in WAITING with the reason, proc `i` (not alive, due to start).
  void StartOrHold(size_t i, const std::string& prefix = "");
  /// Starts every WAITING process nothing holds any longer.
  void StartReleased();
  /// Whether a process of a role that starts after `i`'s is still alive.
  bool HasLiveDependents(size_t i) const;
  /// The run stops: signals the deferred processes whose dependents have all ended.
  void ContinueStop();
  /// Every process of a role that is not a service has ended for good (with services here to stop).
  bool OnlyServicesLeft() const;
  RestartTracker& TrackerFor(size_t i);
  void Info(const std::string& text);
  void Warn(const std::string& text);
  void MaybeRoundStopped();
  double Since(SteadyTime t) const;
  bool Timing() const;

  /// One "now" per event: every decision an event leads to is judged at the same
  /// instant (its events, deadlines and records agree). Public entry points open an
  /// EventTime; Now() outside one reads the clock afresh.
  SteadyTime Now() const { return event_now_ ? *event_now_ : clock_(); }
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
  std::vector<CoreProc> procs_;
  std::vector<std::unique_ptr<RestartTracker>> trackers_;
  std::vector<CoreAction> actions_;
  std::vector<bool> role_warm_, warmup_published_;
  std::vector<std::string> warnings_;
  SteadyTime t0_{};
  bool started_ = false;
  bool stopping_ = false;
  bool told_ready_ = false;
  bool told_only_held_ = false;  ///< said that only processes held by ctl are left
  bool manual_stop_ = false;  ///< `ctl stop all` ended the run
  bool roles_done_ = false;   ///< the roles that are not services are done: the services were stopped
  int stop_signal_ = 0;
  int interrupts_ = 0;
  std::string stop_reason_;
  int culprit_ = -1;
  int culprit_attempt_ = -1;
  bool culprit_restarted_ = false;  ///< the root cause was restarted; another failure ended the run
  /// The first failure since the run was last healthy: the culprit if the run
  /// ends before it recovers (docs/summary-json.md, "culprit").
  int incident_proc_ = -1;
  int incident_attempt_ = -1;
  // Node rounds: the round running, the one being stopped for (-1: none), and
  // the earliest start the failure that asked for it allows (its backoff).
  int round_ = 0;
  int round_pending_ = -1;
  bool round_stopped_sent_ = false;
  SteadyTime round_not_before_{};
  std::string node_culprit_, node_reason_;
  nlohmann::json node_record_;
  int node_exit_code_ = 70;
  bool unguarded_ = false;                 ///< stopped for want of a guardian
  std::vector<SteadyTime> guardian_deaths_;  ///< within kGuardianWindow
  SteadyTime last_woke_{};  ///< the previous OnLoopTurn's `woke` (epoch: none yet)
  int pauses_ = 0;
  double paused_s_ = 0;
};

}  // namespace dflash
