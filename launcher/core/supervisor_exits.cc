// SupervisorCore's answer to a process that ended: what its end means (a stop, collateral, a failure, a
// success), whether it restarts and with which others, and the failure that stops the run (the incident's
// culprit: incident.h).
#include <algorithm>

#include "common/duration.h"
#include "launcher/core/supervisor_core.h"

namespace dflash {

void SupervisorCore::OnExit(size_t i, const ExitStatus& st, const std::string& error_message) {
  EventTime event_time(this);
  JudgeExit(i, st, error_message);
  // What its end frees: the next wave of a stop in reverse order, the
  // dependents of a job that ended 0, and the end of a run of services.
  ContinueStop();
  StartReleased();
  if (!stopping() && order_.OnlyServicesLeft()) {
    incident_.RolesDone();
    Info("every role that is not a service is done: stopping the services");
    BeginStop("every role that is not a service is done; the services were stopped");
  }
}

void SupervisorCore::JudgeExit(size_t i, const ExitStatus& st, const std::string& error_message) {
  ProcessUnit& u = units_[i];
  std::string how = u.EndAttempt(st, error_message);
  if (u.plan().warmup && !stopping() && u.intent() == EndIntent::kNone) {
    OnWarmupExit(i, how);
    return;
  }
  if (u.intent() == EndIntent::kRestart && !stopping()) {  // stopped because its unit restarts
    u.SetOutcome(u.view().manual ? AttemptOutcome::kRestartedByCtl : AttemptOutcome::kRestarted);
    if (!u.view().manual) u.MarkWithUnit();
    u.Enter(ProcState::kBackoff, "stopped for a restart; " + how);
    rounds_.MaybeStopped();
    return;
  }
  if (stopping() || u.intent() == EndIntent::kStop) {
    EndedStopping(i, how);
    return;
  }
  const RoleSpec& role = u.role();
  const AttemptRecord& rec = *u.view().last();
  // A service runs until the run ends: any end before that, 0 included, is a failure.
  bool service_ended = role.service && rec.exit_code == 0 && !u.plan().warmup;
  if (service_ended) u.Reword(how += " (a service must run until the run ends)");
  if (rec.exit_code != 0 || service_ended) NoteFailure(i);
  SteadyTime now = Now();
  RestartDecision d = restarts_.OnExit(i, rec.exit_code, now, role.service);
  switch (d.kind) {
    case RestartDecision::Kind::kRestart: Restart(i, d, how); return;
    case RestartDecision::Kind::kNoRestart:
      if (rec.exit_code == 0 && !service_ended) {
        u.SetOutcome(AttemptOutcome::kSucceeded);
        u.Enter(ProcState::kExited, how);
        return;
      }
      u.SetOutcome(rec.hung ? AttemptOutcome::kHung : AttemptOutcome::kFailed);
      Fail(i, how + " (" + d.reason + ")", false);
      return;
    case RestartDecision::Kind::kExhausted:
      u.SetOutcome(AttemptOutcome::kFatal);
      Fail(i, how + "; " + d.reason, true);
      return;
  }
}

void SupervisorCore::EndedStopping(size_t i, const std::string& how) {
  ProcessUnit& u = units_[i];
  if (u.view().last()->start_failed) {
    // It failed to start on its own while the run stopped: a failure, not collateral.
    u.SetOutcome(AttemptOutcome::kFailed);
    u.Enter(ProcState::kFailed, how);
    return;
  }
  // Stopped by us, or ended on its own after the run began to stop (its peer
  // died and NCCL failed, say): the culprit came first, this is collateral.
  bool by_hand = u.held() || (u.view().manual && u.intent() == EndIntent::kStop);
  // Another node's failure is a culprit too: what it stopped here is collateral.
  u.SetOutcome(by_hand                         ? AttemptOutcome::kStoppedByCtl
               : incident_.BlamesOther(i) ? AttemptOutcome::kCollateral
                                               : AttemptOutcome::kStopped);
  u.Enter(ProcState::kExited, (u.intent() == EndIntent::kStop ? (by_hand ? "stopped by ctl; " : "stopped; ") : "") + how);
}

void SupervisorCore::Restart(size_t i, const RestartDecision& d, const std::string& how) {
  ProcessUnit& u = units_[i];
  SteadyTime now = Now();
  if (node_rounds && restarts_.Wide(i)) {
    // Its unit spans the nodes: every node stops and starts again together.
    u.CountRestart(SteadyTime::max());  // held until StartRound
    u.Enter(ProcState::kBackoff, how + "; " + d.reason + "; every node restarts in a new round");
    rounds_.Request(now + d.delay, u.name() + " " + how);
    return;
  }
  SteadyTime at = now + d.delay;
  u.CountRestart(at);
  std::string what = restarts_.What(i);
  for (size_t j : restarts_.Members(i)) {
    if (j == i) continue;
    ScheduleRestart(j, at, "restarting the " + what + " after " + u.name() + " failed");
  }
  u.Enter(ProcState::kBackoff, how + "; " + d.reason);
}

void SupervisorCore::ScheduleRestart(size_t j, SteadyTime at, const std::string& why) {
  ProcessUnit& q = units_[j];
  // A process held for its warm-up starts when that is done, not at the
  // restart; one stopped by hand stays stopped.
  if (q.state() == ProcState::kWaiting || q.held()) return;
  if (q.alive()) {
    q.SetRestartAt(at);
    if (q.intent() == EndIntent::kNone) q.Stop(EndIntent::kRestart, why);
    else if (q.intent() == EndIntent::kHung) q.SetIntent(EndIntent::kRestart);
    return;
  }
  q.SetRestartAt(q.state() == ProcState::kBackoff ? std::max(q.view().restart_at, at) : at);
  q.Enter(ProcState::kBackoff, "restarts with the others; " + why);
}

void SupervisorCore::OnWarmupExit(size_t i, const std::string& how) {
  ProcessUnit& u = units_[i];
  if (u.view().last()->exit_code != 0) {
    NoteFailure(i);
    u.SetOutcome(AttemptOutcome::kFatal);
    Fail(i, "warm-up failed: " + how + " (its log: " + plan_.AttemptPath(u.plan(), u.view().attempt, "stderr.log") +
                ")",
         true);
    return;
  }
  u.SetOutcome(AttemptOutcome::kSucceeded);
  const GateFacts& g = u.view().gate();
  bool reused = g.role == GateRole::kReuse;
  bool published = g.state == GateState::kReady || reused;
  order_.WarmupDone(u.plan().role_index, published);
  u.Enter(ProcState::kExited, reused      ? "READY was there: nothing to compile"
                              : published ? "compiled in " + FormatSeconds(g.compile_s.value_or(0)) +
                                                ", READY published"
                                          : "ended without publishing READY: the role's processes compile on their own");
  StartReleased();
}

void SupervisorCore::Fail(size_t i, const std::string& reason, bool fatal) {
  ProcessUnit& u = units_[i];
  incident_.Blame(i);
  u.SetReason(reason);
  if (!u.alive()) {
    bool start_failed = u.view().last() && u.view().last()->start_failed;
    u.Enter(fatal ? ProcState::kFatal : start_failed ? ProcState::kFailed : ProcState::kExited, reason);
  }
  BeginStop(u.name() + " " + reason);
}

}  // namespace dflash
