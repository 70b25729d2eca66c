#include "launcher/core/node_rounds.h"

#include <algorithm>

namespace dflash {

void NodeRounds::Request(SteadyTime not_before, const std::string& why) {
  round_not_before_ = std::max(round_not_before_, not_before);
  if (round_pending_ <= round_) {
    CoreAction a = CoreAction::For(CoreAction::Kind::kRoundRequest, static_cast<size_t>(round_));
    a.text = why;
    table_->Emit(std::move(a));
  }
  MaybeStopped();
}

void NodeRounds::Begin(int round, const std::string& why) {
  if (table_->stopping() || round <= round_ || round <= round_pending_) return;
  round_pending_ = round;
  round_stopped_sent_ = false;
  table_->Emit(CoreAction::Log("round " + std::to_string(round) + ": every node restarts its processes (" + why + ")"));
  for (ProcessUnit& u : table_->units()) {
    if (u.plan().warmup || u.held()) continue;  // a warm-up's work is done; one stopped by hand stays stopped
    if (u.alive()) {
      u.SetRestartAt(SteadyTime::max());
      u.Stop(EndIntent::kRestart, "round " + std::to_string(round));
      if (u.intent() == EndIntent::kHung) u.SetIntent(EndIntent::kRestart);
    } else if (u.state() == ProcState::kBackoff) {
      u.SetRestartAt(SteadyTime::max());
    } else if (u.state() == ProcState::kExited || u.state() == ProcState::kFailed) {
      u.SetRestartAt(SteadyTime::max());
      u.Enter(ProcState::kBackoff, "restarts in round " + std::to_string(round));
    }
  }
  MaybeStopped();
}

void NodeRounds::MaybeStopped() {
  if (round_pending_ <= round_ || round_stopped_sent_ || table_->stopping()) return;
  for (const ProcessUnit& u : table_->units())
    if (u.alive() && !u.plan().warmup) return;
  round_stopped_sent_ = true;
  table_->Emit(CoreAction::For(CoreAction::Kind::kRoundStopped, static_cast<size_t>(round_pending_)));
}

void NodeRounds::Start(int round) {
  if (table_->stopping() || round != round_pending_ || !round_stopped_sent_) return;
  round_ = round;
  round_pending_ = -1;
  SteadyTime at = std::max(table_->Now(), round_not_before_);
  round_not_before_ = SteadyTime{};
  table_->Emit(CoreAction::Log("round " + std::to_string(round) + ": every node has stopped; starting again"));
  for (ProcessUnit& u : table_->units())
    if (u.state() == ProcState::kBackoff && !u.alive() && !u.held() && u.view().restart_at == SteadyTime::max())
      u.SetRestartAt(at);
}

}  // namespace dflash
