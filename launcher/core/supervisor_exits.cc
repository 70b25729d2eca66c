// SupervisorCore's answer to a process that ended: what its end means (a stop, collateral, a failure, a
// success), whether it restarts and with which others, and the failure that stops the run (the incident's
// culprit: incident.h).
#include <algorithm>
#include <csignal>

#include "common/signal_names.h"
#include "launcher/core/supervisor_core.h"

namespace dflash {

void SupervisorCore::OnExit(size_t i, const ExitStatus& st, AttemptFiles files) {
  EventTime event_time(this);
  JudgeExit(i, st, std::move(files));
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

void SupervisorCore::JudgeExit(size_t i, const ExitStatus& st, AttemptFiles files) {
  ProcessUnit& u = units_[i];
  std::string how = u.EndAttempt(st, std::move(files));
  if (u.plan().warmup && !stopping() && u.intent() == EndIntent::kNone) {
    OnWarmupExit(i, how);
    return;
  }
  if (u.intent() == EndIntent::kRestart && !stopping()) {  // stopped because its unit restarts
    u.EndForRestart(how);
    rounds_.MaybeStopped();
    return;
  }
  if (stopping() || u.intent() == EndIntent::kStop) {
    u.EndWhileStopping(incident_.BlamesOther(i), how);
    return;
  }
  if (std::string asked = StopAskedOfWorld(i); !asked.empty()) {
    // A stop asked by hand, not a failure: the world is held as by `ctl stop`, nothing restarts or is charged.
    u.EndStoppedByHand(asked, how);
    control_.StopRestOfWorld(i, asked);
    return;
  }
  const AttemptRecord& rec = *u.view().last();
  bool service_ended = u.ServiceEndedEarly(&how);
  if (rec.exit_code != 0 || service_ended) NoteFailure(i);
  RestartDecision d = restarts_.OnExit(i, rec.exit_code, Now(), u.role().service);
  if (d.kind == RestartDecision::Kind::kRestart) {
    Restart(i, d, how);
    return;
  }
  bool fatal = false;
  if (std::string failure = u.EndByPolicy(d, service_ended, how, &fatal); !failure.empty()) Fail(i, failure, fatal);
}

bool SupervisorCore::IsStopSignal(size_t i, int sig) const {
  return sig == units_[i].role().stop.signal || sig == SIGINT || sig == SIGTERM || sig == SIGHUP ||
         std::find(stop_signals.begin(), stop_signals.end(), sig) != stop_signals.end();
}

std::string SupervisorCore::StopAskedOfWorld(size_t i) const {
  const AttemptRecord& rec = *units_[i].view().last();
  // Ended by signal N: killed by it, or exited 128+N as a shell (or a payload's fallback) says it.
  int sig = rec.signal != 0 ? rec.signal
            : rec.exit_code > exit_code::kSignalBase && rec.exit_code < exit_code::kSignalBase + NSIG
                ? rec.exit_code - exit_code::kSignalBase
                : 0;
  if (sig == 0 || !IsStopSignal(i, sig)) return "";
  // The very signal ctl sent to it, or to a peer of its world: a dflash_launch.Checkpoint world agrees on one
  // rank's stop signal and every rank ends by it (docs/checkpoints.md, "Stopping with grace").
  for (size_t j : restarts_.World(i))
    if (units_[j].view().ctl_signal == sig)
      return SignalName(sig) + " sent to " + units_[j].name() + " by ctl" +
             (restarts_.World(i).size() > 1 ? "; its torch world stops with it" : "");
  return "";
}

void SupervisorCore::Restart(size_t i, const RestartDecision& d, const std::string& how) {
  ProcessUnit& u = units_[i];
  SteadyTime now = Now();
  SteadyTime at = now + d.delay;
  if (node_rounds && restarts_.Wide(i)) {
    // Its unit spans the nodes: every node stops and starts again together.
    u.EndForOwnRestart(at, how, d.reason, /*round=*/true);
    rounds_.Request(at, u.name() + " " + how);
    return;
  }
  std::string what = restarts_.What(i);
  for (size_t j : restarts_.Members(i)) {
    if (j == i) continue;
    units_[j].RestartWithUnit(at, "restarting the " + what + " after " + u.name() + " failed");
  }
  u.EndForOwnRestart(at, how, d.reason, /*round=*/false);
}

void SupervisorCore::OnWarmupExit(size_t i, const std::string& how) {
  ProcessUnit& u = units_[i];
  if (u.view().last()->exit_code != 0) {
    NoteFailure(i);
    Fail(i, u.EndWarmupFailed(how, plan_.AttemptPath(u.plan(), u.view().attempt, "stderr.log")), true);
    return;
  }
  order_.WarmupDone(u.plan().role_index, u.EndWarmup());
  StartReleased();
}

void SupervisorCore::Fail(size_t i, const std::string& reason, bool fatal) {
  units_[i].EndFailed(reason, fatal);
  BeginStop(incident_.Blame(i));
}

}  // namespace dflash
