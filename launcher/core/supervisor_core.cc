#include "launcher/core/supervisor_core.h"

#include <algorithm>
#include <csignal>

#include "common/duration.h"
#include "common/exit_codes.h"
#include "common/signal_names.h"
#include "launcher/core/restart_count.h"

namespace dflash {

SupervisorCore::SupervisorCore(const Plan& plan, Clock clock) : plan_(plan), clock_(std::move(clock)) {
  // The role processes, then the warm-ups of roles in gate mode "warmup".
  units_.reserve(plan_.processes.size() + plan_.warmups.size());
  for (const auto* list : {&plan_.processes, &plan_.warmups})
    for (const ProcessPlan& pp : *list)
      units_.emplace_back(units_.size(), pp, plan_.RoleOf(pp), !plan_.NeedsWorker(pp), static_cast<UnitSink*>(this));
  t0_ = clock_();
}

SupervisorCore::~SupervisorCore() = default;

double SupervisorCore::Since(SteadyTime t) const { return std::chrono::duration<double>(t - t0_).count(); }

std::vector<CoreAction> SupervisorCore::TakeActions() {
  std::vector<CoreAction> out;
  out.swap(actions_);
  return out;
}

void SupervisorCore::StateChanged(size_t) { control_.AfterStateChange(); }

void SupervisorCore::StartOrHold(size_t i, const std::string& prefix) {
  std::string why = order_.WhyHeld(i);
  if (why.empty()) Spawn(i);
  else units_[i].Enter(ProcState::kWaiting, prefix + "until " + why);
}

void SupervisorCore::StartReleased() {
  if (stopping()) return;
  for (size_t j = 0; j < units_.size(); ++j)
    if (units_[j].state() == ProcState::kWaiting && !units_[j].held() && order_.WhyHeld(j).empty()) Spawn(j);
}

void SupervisorCore::ContinueStop() {
  if (!stopping()) return;
  for (size_t i = 0; i < units_.size(); ++i)
    if (units_[i].view().stops_after_dependents) units_[i].StopOnceDependentsEnded(order_.HasLiveDependents(i));
}

void SupervisorCore::Start() {
  EventTime event_time(this);
  started_ = true;
  // Warm-ups first: their compile is the long pole. Roles that wait for one
  // (or for the roles they start after) are held; every other role starts at
  // once (a target loading a large model never waits for a drafter's compile).
  for (size_t i = 0; i < units_.size(); ++i)
    if (!stopping() && units_[i].plan().warmup) StartOrHold(i, "");
  for (size_t i = 0; i < units_.size(); ++i)
    if (!stopping() && !units_[i].plan().warmup) StartOrHold(i, "");
}

void SupervisorCore::Spawn(size_t i) { units_[i].BeginAttempt(order_.AfterWarmup(units_[i].plan())); }

void SupervisorCore::OnSpawned(size_t i, pid_t pid, bool exec_pending) {
  EventTime event_time(this);
  units_[i].Spawned(pid);
  if (!exec_pending) OnExecResult(i, true, "");
}

void SupervisorCore::OnSpawnFailed(size_t i, const std::string& why, int exit_code, pid_t pid) {
  EventTime event_time(this);
  if (units_[i].SpawnFailed(why, pid)) return;
  ExitStatus st;
  st.exited = true;
  st.code = exit_code != 0 ? exit_code : exit_code::kFailure;
  OnExit(i, st, {});
}

void SupervisorCore::OnExecResult(size_t i, bool ok, const std::string& err) {
  EventTime event_time(this);
  ProcessUnit::ExecOutcome out = units_[i].SettleExec(ok, err);
  if (out.ready) MarkReady(i, "started");
  if (out.stop) units_[i].SignalStop(*out.stop);
}

void SupervisorCore::OnProbeResult(size_t i, uint64_t seq, bool answered, const std::string& detail) {
  EventTime event_time(this);
  std::string hung;
  if (std::optional<std::string> ready = units_[i].TakeProbe(seq, answered, detail, stopping(), &hung))
    MarkReady(i, *ready);
  else if (!hung.empty())
    Hang(i, hung);
}

void SupervisorCore::MarkReady(size_t i, const std::string& why) {
  if (!units_[i].BecomeRunning(why)) return;
  StartReleased();  // what starts after its role may be free to go
  bool all = std::all_of(units_.begin(), units_.end(), [](const ProcessUnit& u) {
    return u.state() == ProcState::kRunning || u.state() == ProcState::kExited;
  });
  if (all && !told_ready_) {
    told_ready_ = true;
    std::string n = std::to_string(plan_.processes.size());
    CoreAction a;
    a.kind = CoreAction::Kind::kTellSystemd;
    a.text = "READY=1\nSTATUS=all " + n + " processes running";
    Emit(std::move(a));
    Info("all " + n + " processes are running");
  }
}

void SupervisorCore::OnOutput(size_t i) {
  EventTime event_time(this);
  units_[i].OnOutput();
}

void SupervisorCore::OnReport(size_t i, const NotifyFields& r) {
  EventTime event_time(this);
  ProcessUnit& u = units_[i];
  u.TakeReport(r);
  if (r.gate_warning) AddWarning(*r.gate_warning);
  u.TakeGateFacts(r);
  if (std::optional<std::string> ready = u.ReadyFrom(r)) {
    MarkReady(i, *ready);
    if (u.view().gate().role == GateRole::kReuse) Emit(CoreAction::For(CoreAction::Kind::kCheckReuse, i));
  }
}

void SupervisorCore::AddWarning(const std::string& w) {
  EventTime event_time(this);
  if (std::find(warnings_.begin(), warnings_.end(), w) != warnings_.end()) return;
  warnings_.push_back(w);
  Warn(w);
}

bool SupervisorCore::OnGuardianDied(const std::string& how) {
  EventTime event_time(this);
  if (!guardian_.OnDeath(Now())) {
    StopUnguarded("dflash-guardian " + how + "; it died " + std::to_string(guardian_.deaths()) +
                  " times within " + FormatDuration(GuardianRestarts::kWindow) +
                  ": not started again; stopping the run, which a SIGKILL of the launcher would leave behind");
    return false;
  }
  Warn("dflash-guardian " + how + ": starting a new one (a run is never left without one)");
  return true;
}

void SupervisorCore::StopUnguarded(const std::string& why) {
  EventTime event_time(this);
  if (!incident_.unguarded()) Warn(why);
  incident_.Unguarded();
  BeginStop(why);
}

void SupervisorCore::NoteMemoryPeak(size_t i, int64_t bytes) { units_[i].NoteMemoryPeak(bytes); }

void SupervisorCore::OnSignal(int sig) {
  EventTime event_time(this);
  if (sig == SIGINT || sig == SIGTERM || sig == SIGHUP ||
      std::find(stop_signals.begin(), stop_signals.end(), sig) != stop_signals.end()) {
    ++interrupts_;
    if (!stopping()) {
      incident_.StoppedBySignal(sig);
      Info("received " + SignalName(sig) + ": stopping every process (again to kill at once)");
      BeginStop("stopped by " + SignalName(sig));
    } else if (interrupts_ > 1) {
      Info("received " + SignalName(sig) + " again: killing every process now");
      Abort("");
    }
    return;
  }
  // [run] forward_signals: pass through to every live worker (it forwards to its payload).
  for (size_t i = 0; i < units_.size(); ++i) {
    if (!units_[i].alive()) continue;
    CoreAction a = CoreAction::For(CoreAction::Kind::kSignal, i);
    a.signal = sig;
    Emit(std::move(a));
  }
  Info("forwarded " + SignalName(sig) + " to every process");
}

void SupervisorCore::Abort(const std::string& why) {
  EventTime event_time(this);
  if (!why.empty()) Warn(why);
  for (ProcessUnit& u : units_)
    if (u.alive() && u.intent() != EndIntent::kStop) u.SetIntent(EndIntent::kStop);
  if (!stopping()) BeginStop(why.empty() ? "killed" : why);
  CoreAction a;
  a.kind = CoreAction::Kind::kKillAll;
  Emit(std::move(a));
}

void SupervisorCore::Hang(size_t i, const std::string& why) {
  NoteFailure(i);
  units_[i].Hang(why);
}

void SupervisorCore::BeginStop(const std::string& reason) {
  if (!incident_.BeginStop(reason)) return;
  CoreAction a;
  a.kind = CoreAction::Kind::kTellSystemd;
  a.text = "STOPPING=1\nSTATUS=" + reason;
  Emit(std::move(a));
  for (size_t i = 0; i < units_.size(); ++i) {
    ProcessUnit& u = units_[i];
    bool live_dependents = u.alive() && u.intent() == EndIntent::kNone && order_.HasLiveDependents(i);
    u.StopWithRun(live_dependents, u.state() == ProcState::kWaiting ? order_.WhyHeld(i) : "");
  }
}

void SupervisorCore::StopByHand(const std::string& reason) {
  incident_.StoppedByHand();
  BeginStop(reason);
}

void SupervisorCore::OnTick() {
  EventTime event_time(this);
  SteadyTime now = Now();
  for (size_t i = 0; i < units_.size(); ++i) {
    ProcessUnit& u = units_[i];
    UnitDue due = u.TakeDue(now, stopping());
    if (due.restart) StartOrHold(i, "restarts ");
    if (due.ready_timeout) {
      // The worker enforces this for the processes it hosts; these are ours.
      std::string why = u.ReadyTimedOut();
      NoteFailure(i);
      Fail(i, why, false);
    }
    if (!due.hung.empty() && u.state() == ProcState::kRunning) Hang(i, due.hung);
    u.ProbeIfDue(now, stopping());
  }
}

void SupervisorCore::OnLoopTurn(SteadyTime wait_began, SteadyTime asked, SteadyTime woke) {
  // Two ways the supervisor misses time: stopped while it waited (it wakes
  // later than it asked), or while it worked (the turn before took long).
  SteadyTime::duration late = asked == SteadyTime::max() ? SteadyTime::duration::zero() : woke - asked;
  SteadyTime::duration work =
      last_woke_ == SteadyTime{} ? SteadyTime::duration::zero() : wait_began - last_woke_;
  last_woke_ = woke;
  SteadyTime::duration lost = std::max(late, work);
  if (lost > kPauseSlack) OnPaused(lost);
}

bool SupervisorCore::Timing() const {
  return std::any_of(units_.begin(), units_.end(), [](const ProcessUnit& u) { return u.Timed(); });
}

void SupervisorCore::OnPaused(SteadyTime::duration lost) {
  EventTime event_time(this);
  ++pauses_;
  double s = std::chrono::duration<double>(lost).count();
  paused_s_ += s;
  if (!Timing()) return;  // nothing judged by time: nothing to give back
  for (ProcessUnit& u : units_) u.GiveBack(lost);
  Warn("the supervisor did not run for " + FormatSeconds(s) +
       " (stopped, frozen or starved): readiness and stop grace postponed by that, watchdogs re-armed; "
       "nothing is judged on time it did not see");
}

SteadyTime SupervisorCore::NextWake(SteadyTime now) const {
  SteadyTime next = NextDeadline();
  if (Timing()) next = std::min(next, now + kPauseProbe);
  return next;
}

bool SupervisorCore::Done() const {
  if (!started_) return false;
  for (const ProcessUnit& u : units_) {
    if (u.alive() || u.state() == ProcState::kBackoff) return false;
    // Stopped by hand: the run stays up until `ctl start` or `ctl stop all`.
    if (u.held() && !stopping()) return false;
  }
  return true;
}

SteadyTime SupervisorCore::NextDeadline() const {
  SteadyTime next = SteadyTime::max();
  for (const ProcessUnit& u : units_) next = std::min(next, u.NextDeadline(stopping()));
  return next;
}

int SupervisorCore::FindSender(pid_t pid, pid_t pgid) const {
  for (size_t i = 0; i < units_.size(); ++i) {
    const CoreProc& p = units_[i].view();
    if (p.pid > 0 && (pid == p.pid || pgid == p.pid)) return static_cast<int>(i);
  }
  return -1;
}

// Store-mode rounds (node_rounds.h) and live control (control_verbs.h): their own classes, entered here.
void SupervisorCore::BeginRound(int round, const std::string& why) {
  EventTime event_time(this);
  rounds_.Begin(round, why);
}

void SupervisorCore::StartRound(int round) {
  EventTime event_time(this);
  rounds_.Start(round);
}

void SupervisorCore::StopForNode(NodeStop stop) {
  EventTime event_time(this);
  if (stopping()) return;
  incident_.StoppedForNode(stop.culprit, stop.reason, stop.exit_code, std::move(stop.record));
  Warn(stop.reason + ": stopping every process");
  BeginStop(stop.reason);
}

RunStatus SupervisorCore::Status() {
  EventTime event_time(this);
  return control_.Status(status_base);
}

ControlReply SupervisorCore::Apply(const ControlRequest& request) {
  EventTime event_time(this);
  return control_.Apply(request, status_base);
}

RunVerdict SupervisorCore::Verdict(const std::string& start_error) const {
  auto training = [this](size_t i, int attempt) {
    for (const AttemptRecord& a : units_[i].view().attempts)
      if (a.attempt == attempt) return a.training;
    return AttemptTraining{};
  };
  RunVerdict v = incident_.Verdict(start_error, training);
  if (!records_error_.empty()) v.RecordsIncomplete(records_error_);
  return v;
}

void SupervisorCore::RecordsIncomplete(const std::string& what) {
  records_error_ += (records_error_.empty() ? "" : "; ") + what;
}

ProcView SupervisorCore::view(size_t i) const {
  const CoreProc& p = units_[i].view();
  ProcView v;
  v.plan = p.plan;
  v.state = p.state;
  v.pid = p.pid;
  v.payload_pid = p.payload_pid;
  v.attempt = p.attempt;
  v.exec_pending = p.exec_pending;
  v.started = p.started;
  if (const AttemptRecord* last = p.last()) v.last_pid = last->pid;
  for (const AttemptRecord& a : p.attempts)
    if (a.end_s >= 0) v.last_exit_code = a.exit_code;
  v.gate = p.gate();
  v.restart_reasons = RestartReasons(p.attempts);
  return v;
}

std::string SupervisorCore::CulpritReason() const {
  if (culprit() < 0) return "";
  const AttemptRecord* a = incident_.culprit_attempt();
  return a ? a->reason : units_[static_cast<size_t>(culprit())].view().reason;
}

}  // namespace dflash
