// SupervisorCore's answer to a process that ended: what its attempt was
// (outcome, reason), whether it restarts and with which others, the incident
// and its culprit, and from those the run's exit code and reason.
#include <algorithm>

#include "common/duration.h"
#include "common/exit_codes.h"
#include "launcher/supervise/supervisor_core.h"

namespace dflash {

void SupervisorCore::NoteFailure(size_t i) {
  MaybeCloseIncident();
  if (incident_proc_ >= 0) return;
  incident_proc_ = static_cast<int>(i);
  incident_attempt_ = procs_[i].attempt;
}

void SupervisorCore::MaybeCloseIncident() {
  // The run is healthy again when nothing waits to restart, starts or stops,
  // and every live process has run its role's reset_after (the same "ran long
  // enough" that resets the backoff): a failure after that is a new incident.
  if (incident_proc_ < 0 || stopping_) return;
  SteadyTime now = Now();
  for (const CoreProc& p : procs_) {
    if (p.state == ProcState::kBackoff || p.state == ProcState::kStarting || p.state == ProcState::kStopping ||
        p.state == ProcState::kFailed || p.state == ProcState::kFatal)
      return;
    if (p.alive() && now - p.started < plan_.RoleOf(*p.plan).restart.reset_after) return;
  }
  incident_proc_ = incident_attempt_ = -1;
}

void SupervisorCore::OnExit(size_t i, const ExitStatus& st, const std::string& error_message) {
  EventTime event_time(this);
  JudgeExit(i, st, error_message);
  // What its end frees: the next wave of a stop in reverse order, the
  // dependents of a job that ended 0, and the end of a run of services.
  ContinueStop();
  StartReleased();
  if (!stopping_ && OnlyServicesLeft()) {
    roles_done_ = true;
    Info("every role that is not a service is done: stopping the services");
    BeginStop("every role that is not a service is done; the services were stopped");
  }
}

void SupervisorCore::JudgeExit(size_t i, const ExitStatus& st, const std::string& error_message) {
  CoreProc& p = procs_[i];
  SteadyTime now = Now();
  AttemptRecord& rec = p.current();
  p.ended = now;
  p.pid = -1;
  p.exec_pending = false;
  // A stop held back for its exec outcome that never came: it ended first, stopped as decided
  // (the shell answers before it reports an exit, so only a harness gets here).
  p.stop_after_exec.reset();
  p.watchdog_at = SteadyTime::max();
  p.kill_at = SteadyTime::max();
  rec.end_s = Since(now);
  rec.exit_code = st.ExitCode();
  rec.signal = st.signaled ? st.signal : p.payload_signal;
  // The worker passes its payload's status up as its own; it also told us how
  // the payload ended (killed by SIGSEGV, not "exited with code 139").
  std::string how = !p.payload_exit.empty() && st.exited ? p.payload_exit : st.Describe();
  if (!p.worker_error.empty()) how += ": " + p.worker_error;
  else if (!error_message.empty()) how += ": " + error_message;
  else if (rec.start_failed && !rec.reason.empty()) how = rec.reason;  // the spawn error
  // The worker could not execute its payload: as much a start failure as ours.
  if (!p.worker_error.empty() &&
      (rec.exit_code == exit_code::kNotFound || rec.exit_code == exit_code::kNotExecutable))
    rec.start_failed = true;
  if (rec.start_failed && how.find("exit") == std::string::npos) how += " (exit " + std::to_string(rec.exit_code) + ")";
  if (p.intent == EndIntent::kHung) {
    how = "hung: " + p.hung_why + "; " + how;
    rec.hung = true;
  }
  // Probed for readiness and never answered: the process died first, and the probe says what it never saw.
  if (p.state == ProcState::kStarting && p.readiness && p.readiness->WantsProbe() && !rec.start_failed &&
      p.intent == EndIntent::kNone)
    how += " before it was ready (ready = " + DescribeNotReady(p.readiness->spec()) +
           (p.readiness->last_probe().empty() ? "" : "; last try: " + p.readiness->last_probe()) + ")";
  p.probe_out = false;
  p.probe_at = SteadyTime::max();
  // Not ready in time: the timeout is why it failed, the stop signal only how it ended.
  if (rec.ready_timeout && !p.reason.empty()) how = p.reason + "; " + how;
  rec.reason = how;
  p.reason = how;
  CoreAction ended;
  ended.kind = CoreAction::Kind::kEnded;
  ended.index = i;
  actions_.push_back(std::move(ended));

  if (p.plan->warmup && !stopping_ && p.intent == EndIntent::kNone) {
    OnWarmupExit(i, how);
    return;
  }
  if (p.intent == EndIntent::kRestart && !stopping_) {  // stopped because its unit restarts
    rec.outcome = p.manual ? AttemptOutcome::kRestartedByCtl : AttemptOutcome::kRestarted;
    SetState(i, ProcState::kBackoff, "stopped for a restart; " + how);
    MaybeRoundStopped();
    return;
  }
  if ((stopping_ || p.intent == EndIntent::kStop) && rec.start_failed) {
    // It failed to start on its own while the run stopped: a failure, not collateral.
    rec.outcome = AttemptOutcome::kFailed;
    SetState(i, ProcState::kFailed, how);
    return;
  }
  if (stopping_ || p.intent == EndIntent::kStop) {
    // Stopped by us, or ended on its own after the run began to stop (its peer
    // died and NCCL failed, say): the culprit came first, this is collateral.
    bool by_hand = p.held || (p.manual && p.intent == EndIntent::kStop);
    // Another node's failure is a culprit too: what it stopped here is collateral.
    rec.outcome = by_hand                                                              ? AttemptOutcome::kStoppedByCtl
                  : (culprit_ >= 0 && culprit_ != static_cast<int>(i)) || !node_culprit_.empty() ? AttemptOutcome::kCollateral
                                                                                       : AttemptOutcome::kStopped;
    SetState(i, ProcState::kExited,
             (p.intent == EndIntent::kStop ? (by_hand ? "stopped by ctl; " : "stopped; ") : "") + how);
    return;
  }
  const RoleSpec& role = plan_.RoleOf(*p.plan);
  // A service runs until the run ends: any end before that, 0 included, is a failure.
  bool service_ended = role.service && rec.exit_code == 0 && !p.plan->warmup;
  if (service_ended) how += " (a service must run until the run ends)";
  if (service_ended) rec.reason = p.reason = how;
  if (rec.exit_code != 0 || service_ended) NoteFailure(i);
  RestartDecision d = TrackerFor(i).OnExit(rec.exit_code, std::chrono::duration_cast<Millis>(now - p.started), now,
                                           role.service);
  switch (d.kind) {
    case RestartDecision::Kind::kRestart: {
      if (node_rounds && (role.restart.scope != RestartScope::kProcess || role.world != TorchWorld::kNone)) {
        // Its unit spans the nodes: every node stops and starts again together.
        ++p.restarts;
        rec.outcome = AttemptOutcome::kRestarted;
        p.restart_at = SteadyTime::max();  // held until StartRound
        round_not_before_ = std::max(round_not_before_, now + d.delay);
        SetState(i, ProcState::kBackoff, how + "; " + d.reason + "; every node restarts in a new round");
        if (round_pending_ <= round_) {
          CoreAction a;
          a.kind = CoreAction::Kind::kRoundRequest;
          a.index = static_cast<size_t>(round_);
          a.text = p.plan->name + " " + how;
          actions_.push_back(std::move(a));
        }
        MaybeRoundStopped();
        return;
      }
      SteadyTime at = now + d.delay;
      ++p.restarts;
      rec.outcome = AttemptOutcome::kRestarted;
      p.restart_at = at;
      std::string what = role.restart.scope == RestartScope::kAll ? "run" : role.world != TorchWorld::kNone
                                                                                 ? "torch world"
                                                                                 : "role";
      for (size_t j : RestartUnit(i)) {
        if (j == i) continue;
        ScheduleRestart(j, at, "restarting the " + what + " after " + p.plan->name + " failed");
      }
      SetState(i, ProcState::kBackoff, how + "; " + d.reason);
      return;
    }
    case RestartDecision::Kind::kNoRestart:
      if (rec.exit_code == 0 && !service_ended) {
        rec.outcome = AttemptOutcome::kSucceeded;
        SetState(i, ProcState::kExited, how);
        return;
      }
      rec.outcome = rec.hung ? AttemptOutcome::kHung : AttemptOutcome::kFailed;
      Fail(i, how + " (" + d.reason + ")", false);
      return;
    case RestartDecision::Kind::kExhausted:
      rec.outcome = AttemptOutcome::kFatal;
      Fail(i, how + "; " + d.reason, true);
      return;
  }
}

void SupervisorCore::ScheduleRestart(size_t j, SteadyTime at, const std::string& why) {
  CoreProc& q = procs_[j];
  // A process held for its warm-up starts when that is done, not at the
  // restart; one stopped by hand stays stopped.
  if (q.state == ProcState::kWaiting || q.held) return;
  if (q.alive()) {
    q.restart_at = at;
    if (q.intent == EndIntent::kNone) StopProc(j, EndIntent::kRestart, why);
    else if (q.intent == EndIntent::kHung) q.intent = EndIntent::kRestart;
    return;
  }
  q.restart_at = q.state == ProcState::kBackoff ? std::max(q.restart_at, at) : at;
  SetState(j, ProcState::kBackoff, "restarts with the others; " + why);
}

void SupervisorCore::OnWarmupExit(size_t i, const std::string& how) {
  CoreProc& p = procs_[i];
  size_t ri = p.plan->role_index;
  if (p.current().exit_code != 0) {
    NoteFailure(i);
    p.current().outcome = AttemptOutcome::kFatal;
    Fail(i, "warm-up failed: " + how + " (its log: " + plan_.AttemptPath(*p.plan, p.attempt, "stderr.log") + ")",
         true);
    return;
  }
  p.current().outcome = AttemptOutcome::kSucceeded;
  role_warm_[ri] = true;
  const GateFacts& g = p.gate();
  bool reused = g.role == GateRole::kReuse;
  warmup_published_[ri] = g.state == GateState::kReady || reused;
  SetState(i, ProcState::kExited,
           reused                   ? "READY was there: nothing to compile"
           : warmup_published_[ri] ? "compiled in " + FormatSeconds(g.compile_s.value_or(0)) +
                                          ", READY published"
                                    : "ended without publishing READY: the role's processes compile on their own");
  StartReleased();
}

void SupervisorCore::Fail(size_t i, const std::string& reason, bool fatal) {
  CoreProc& p = procs_[i];
  if (culprit_ < 0) {
    // The root cause: the first failure of the incident, even if that one was
    // restartable when it happened (the others may only be its echo).
    // (The same process failing again is its own story: its last failure is named.)
    if (incident_proc_ >= 0 && incident_proc_ != static_cast<int>(i)) {
      culprit_ = incident_proc_;
      culprit_attempt_ = incident_attempt_;
      culprit_restarted_ = true;
    } else {
      culprit_ = static_cast<int>(i);
      culprit_attempt_ = p.attempt;
    }
  }
  p.reason = reason;
  if (!p.alive()) {
    bool start_failed = p.last() && p.last()->start_failed;
    SetState(i, fatal ? ProcState::kFatal : start_failed ? ProcState::kFailed : ProcState::kExited, reason);
  }
  BeginStop(p.plan->name + " " + reason);
}

const AttemptRecord* SupervisorCore::culprit_attempt() const {
  if (culprit_ < 0) return nullptr;
  const CoreProc& c = procs_[static_cast<size_t>(culprit_)];
  for (const AttemptRecord& a : c.attempts)
    if (a.attempt == culprit_attempt_) return &a;
  return c.last();
}

int SupervisorCore::ExitCode() const {
  if (const AttemptRecord* a = culprit_attempt()) {
    if (a->ready_timeout) return exit_code::kTimeout;
    return a->exit_code > 0 ? a->exit_code : exit_code::kFailure;
  }
  if (!node_culprit_.empty()) return node_exit_code_;
  if (unguarded_) return exit_code::kFailure;
  if (stop_signal_) return exit_code::kSignalBase + stop_signal_;
  return 0;
}

std::string SupervisorCore::ExitReason() const {
  if (culprit_ >= 0) {
    const CoreProc& c = procs_[static_cast<size_t>(culprit_)];
    const AttemptRecord* a = culprit_attempt();
    // The root cause was restarted and something else ended the run: say both.
    if (culprit_restarted_ && a)
      return c.plan->name + " " + a->reason + " (attempt " + std::to_string(a->attempt) + ", restarted); then " +
             stop_reason_;
    return c.plan->name + " " + c.reason;
  }
  if (!node_culprit_.empty()) return node_reason_;
  if (unguarded_ || stop_signal_ || manual_stop_ || roles_done_) return stop_reason_;
  return "all processes succeeded";
}

}  // namespace dflash
