// SupervisorCore's restart rounds in store mode: a restart whose unit spans the
// nodes stops every node's processes, and they start again together once every
// node has said it stopped (launcher/cluster/node_coordinator.h runs the protocol).
#include <algorithm>

#include "launcher/supervise/supervisor_core.h"

namespace dflash {

void SupervisorCore::BeginRound(int round, const std::string& why) {
  EventTime event_time(this);
  if (stopping_ || round <= round_ || round <= round_pending_) return;
  round_pending_ = round;
  round_stopped_sent_ = false;
  Info("round " + std::to_string(round) + ": every node restarts its processes (" + why + ")");
  for (size_t i = 0; i < procs_.size(); ++i) {
    CoreProc& p = procs_[i];
    if (p.plan->warmup || p.held) continue;  // a warm-up's work is done; one stopped by hand stays stopped
    if (p.alive()) {
      p.restart_at = SteadyTime::max();
      StopProc(i, EndIntent::kRestart, "round " + std::to_string(round));
      if (p.intent == EndIntent::kHung) p.intent = EndIntent::kRestart;
    } else if (p.state == ProcState::kBackoff) {
      p.restart_at = SteadyTime::max();
    } else if (p.state == ProcState::kExited || p.state == ProcState::kFailed) {
      p.restart_at = SteadyTime::max();
      SetState(i, ProcState::kBackoff, "restarts in round " + std::to_string(round));
    }
  }
  MaybeRoundStopped();
}

void SupervisorCore::MaybeRoundStopped() {
  if (round_pending_ <= round_ || round_stopped_sent_ || stopping_) return;
  for (const CoreProc& p : procs_)
    if (p.alive() && !p.plan->warmup) return;
  round_stopped_sent_ = true;
  CoreAction a;
  a.kind = CoreAction::Kind::kRoundStopped;
  a.index = static_cast<size_t>(round_pending_);
  actions_.push_back(std::move(a));
}

void SupervisorCore::StartRound(int round) {
  EventTime event_time(this);
  if (stopping_ || round != round_pending_ || !round_stopped_sent_) return;
  round_ = round;
  round_pending_ = -1;
  SteadyTime at = std::max(Now(), round_not_before_);
  round_not_before_ = SteadyTime{};
  Info("round " + std::to_string(round) + ": every node has stopped; starting again");
  for (CoreProc& p : procs_)
    if (p.state == ProcState::kBackoff && !p.alive() && !p.held && p.restart_at == SteadyTime::max())
      p.restart_at = at;
}

void SupervisorCore::StopForNode(const std::string& culprit, const std::string& reason, int exit_code,
                                 nlohmann::json record) {
  EventTime event_time(this);
  if (stopping_) return;
  node_culprit_ = culprit;
  node_record_ = std::move(record);
  node_exit_code_ = exit_code;
  node_reason_ = reason;
  Warn(reason + ": stopping every process");
  BeginStop(reason);
}

}  // namespace dflash
