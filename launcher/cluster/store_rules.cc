#include "launcher/cluster/store_rules.h"

namespace dflash {

Standing JudgeRefresh(long long refresh, bool new_connection) {
  if (refresh == 1) return Standing::kRegistered;
  if (refresh == 2) return new_connection ? Standing::kRecreate : Standing::kVanished;
  return Standing::kReplaced;
}

Standing JudgeRecreate(long long recreate) { return recreate == 1 ? Standing::kRegistered : Standing::kReplaced; }

StoreOutage::Step StoreOutage::Failed(SteadyTime now) {
  if (!away_) {
    away_ = true;
    since_ = now;
    return Step::kBegan;
  }
  return now - since_ > outage_ ? Step::kTooLong : Step::kGoingOn;
}

std::optional<SteadyTime::duration> StoreOutage::Back(SteadyTime now) {
  if (!away_) return std::nullopt;
  away_ = false;
  return now - since_;
}

RoundBarrier::Verdict RoundBarrier::Poll(int waiting, int current, long long stopped, const std::vector<int>& finished,
                                         SteadyTime now) {
  Verdict v;
  if (waiting <= started_) return v;
  v.round = waiting;
  std::string round = "round " + std::to_string(waiting);
  if (!waiting_since_) waiting_since_ = now;
  // A node that already ended cannot join the round; one that never stops is bounded.
  if (!finished.empty()) {
    v.kind = Verdict::Kind::kGiveUp;
    v.why = "node " + std::to_string(finished.front()) + " had already finished: " + round +
            " cannot restart every node";
    return v;
  }
  if (now - *waiting_since_ > timeout_) {
    v.kind = Verdict::Kind::kGiveUp;
    v.why = round + ": not every node stopped within " + FormatDuration(timeout_) + " ([run] store_barrier_timeout)";
    return v;
  }
  if (waiting == current && stopped >= nnodes_) {
    waiting_since_.reset();
    started_ = waiting;
    v.kind = Verdict::Kind::kStart;
  }
  return v;
}

}  // namespace dflash
