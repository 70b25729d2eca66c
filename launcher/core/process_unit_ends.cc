// ProcessUnit's side of the run's moves: a restart of its unit, the run's stop, and how each of its ends is
// recorded. The core decides which move; the unit knows what the move means for its state and record.
#include <algorithm>

#include "common/duration.h"
#include "launcher/core/process_unit.h"

namespace dflash {

void ProcessUnit::RestartWithUnit(SteadyTime at, const std::string& why) {
  // A process held for its warm-up starts when that is done, not at the
  // restart; one stopped by hand stays stopped.
  if (p_.state == ProcState::kWaiting || p_.held) return;
  if (alive()) {
    p_.restart_at = at;
    if (p_.intent == EndIntent::kNone) Stop(EndIntent::kRestart, why);
    else if (p_.intent == EndIntent::kHung) p_.intent = EndIntent::kRestart;
    return;
  }
  p_.restart_at = p_.state == ProcState::kBackoff ? std::max(p_.restart_at, at) : at;
  Enter(ProcState::kBackoff, "restarts with the others; " + why);
}

void ProcessUnit::StopWithRun(bool live_dependents, const std::string& why_held) {
  if (alive()) {
    if (p_.intent == EndIntent::kRestart) {
      p_.intent = EndIntent::kStop;
    } else if (p_.intent == EndIntent::kNone && live_dependents) {
      // Stacks stop in reverse: a server outlives its clients, so they end cleanly.
      p_.stops_after_dependents = true;
      Info(name() + " stops once what starts after it has stopped");
    } else {
      Stop(EndIntent::kStop, "stopping the run");
    }
  } else if (p_.state == ProcState::kBackoff) {
    // Its restart never came: its own failure stands as such, a stop for its unit's restart as collateral.
    if (p_.last() && p_.last()->outcome == AttemptOutcome::kRestarted)
      SetOutcome(p_.last()->with_unit ? AttemptOutcome::kCollateral : AttemptOutcome::kFailed);
    Enter(ProcState::kExited, "not restarted: the run is stopping");
  } else if (p_.state == ProcState::kNotStarted) {
    p_.reason = "not started: the run stopped before its turn";
  } else if (p_.state == ProcState::kWaiting) {
    p_.reason = "not started: the run stopped before " + (why_held.empty() ? "its turn" : why_held);
    Enter(ProcState::kNotStarted, p_.reason);
  }
}

void ProcessUnit::EndForRestart(const std::string& how) {
  SetOutcome(p_.manual ? AttemptOutcome::kRestartedByCtl : AttemptOutcome::kRestarted);
  if (!p_.manual) MarkWithUnit();
  Enter(ProcState::kBackoff, "stopped for a restart; " + how);
}

void ProcessUnit::EndWhileStopping(bool blamed_elsewhere, const std::string& how) {
  if (p_.last()->start_failed) {
    // It failed to start on its own while the run stopped: a failure, not collateral.
    SetOutcome(AttemptOutcome::kFailed);
    Enter(ProcState::kFailed, how);
    return;
  }
  // Stopped by us, or ended on its own after the run began to stop (its peer
  // died and NCCL failed, say): the culprit came first, this is collateral.
  bool by_hand = p_.held || (p_.manual && p_.intent == EndIntent::kStop);
  // Another node's failure is a culprit too: what it stopped here is collateral.
  SetOutcome(by_hand            ? AttemptOutcome::kStoppedByCtl
             : blamed_elsewhere ? AttemptOutcome::kCollateral
                                : AttemptOutcome::kStopped);
  Enter(ProcState::kExited, (p_.intent == EndIntent::kStop ? (by_hand ? "stopped by ctl; " : "stopped; ") : "") + how);
}

void ProcessUnit::EndStoppedByHand(const std::string& why, const std::string& how) {
  p_.held = true;
  p_.manual = true;
  SetOutcome(AttemptOutcome::kStoppedByCtl);
  Enter(ProcState::kExited, "stopped by ctl (" + why + "); " + how);
}

std::string ProcessUnit::ReadyTimedOut() {
  p_.current().ready_timeout = true;
  return "(pid " + std::to_string(p_.pid) + ") " + (p_.readiness ? p_.readiness->TimeoutText() : "not ready in time");
}

bool ProcessUnit::ServiceEndedEarly(std::string* how) {
  if (!role_.service || p_.last()->exit_code != 0 || plan().warmup) return false;
  *how += " (a service must run until the run ends)";
  Reword(*how);
  return true;
}

std::string ProcessUnit::EndByPolicy(const RestartDecision& d, bool service_ended, const std::string& how,
                                     bool* fatal) {
  *fatal = d.kind == RestartDecision::Kind::kExhausted;
  if (*fatal) {
    SetOutcome(AttemptOutcome::kFatal);
    return how + "; " + d.reason;
  }
  if (p_.last()->exit_code == 0 && !service_ended) {
    SetOutcome(AttemptOutcome::kSucceeded);
    Enter(ProcState::kExited, how);
    return "";
  }
  SetOutcome(p_.last()->hung ? AttemptOutcome::kHung : AttemptOutcome::kFailed);
  return how + " (" + d.reason + ")";
}

void ProcessUnit::EndForOwnRestart(SteadyTime at, const std::string& how, const std::string& reason, bool round) {
  CountRestart(round ? SteadyTime::max() : at);  // a round: held until StartRound
  Enter(ProcState::kBackoff, how + "; " + reason + (round ? "; every node restarts in a new round" : ""));
}

std::string ProcessUnit::EndWarmupFailed(const std::string& how, const std::string& log) {
  SetOutcome(AttemptOutcome::kFatal);
  return "warm-up failed: " + how + " (its log: " + log + ")";
}

void ProcessUnit::StopOnceDependentsEnded(bool live_dependents) {
  if (!p_.stops_after_dependents || live_dependents) return;
  p_.stops_after_dependents = false;
  if (alive()) Stop(EndIntent::kStop, "stopping the run; what starts after it has stopped");
}

bool ProcessUnit::EndWarmup() {
  SetOutcome(AttemptOutcome::kSucceeded);
  const GateFacts& g = p_.gate();
  bool reused = g.role == GateRole::kReuse;
  bool published = g.state == GateState::kReady || reused;
  Enter(ProcState::kExited, reused      ? "READY was there: nothing to compile"
                            : published ? "compiled in " + FormatSeconds(g.compile_s.value_or(0)) +
                                              ", READY published"
                                        : "ended without publishing READY: the role's processes compile on their own");
  return published;
}

void ProcessUnit::EndFailed(const std::string& reason, bool fatal) {
  p_.reason = reason;
  if (alive()) return;
  bool start_failed = p_.last() && p_.last()->start_failed;
  Enter(fatal ? ProcState::kFatal : start_failed ? ProcState::kFailed : ProcState::kExited, reason);
}

}  // namespace dflash
