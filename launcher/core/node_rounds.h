// Restart rounds in store mode (docs/multinode.md): a restart whose unit spans the nodes stops every node's
// processes, and they start again together once every node has said it stopped. The node coordinator
// (launcher/cluster/node_coordinator.h) runs the protocol; this is one node's side of it.
#pragma once

#include <string>

#include "launcher/core/unit_table.h"

namespace dflash {

class NodeRounds {
 public:
  explicit NodeRounds(UnitTable* table) : table_(table) {}

  /// A failure (`why`) asks every node for a new round; the processes start again no sooner than `not_before`
  /// (its backoff): held in BACKOFF until Start.
  void Request(SteadyTime not_before, const std::string& why);
  /// Round `round` began (any node asked): stop every process for it, hold them, and say kRoundStopped once
  /// none is left running.
  void Begin(int round, const std::string& why);
  /// Every node stopped for `round`: start every held process again (after the backoff of the failure that
  /// asked for the round, if later).
  void Start(int round);
  /// Says kRoundStopped once no process here is left running for the round under way.
  void MaybeStopped();
  int round() const { return round_; }

 private:
  UnitTable* table_;
  int round_ = 0;           ///< the round running
  int round_pending_ = -1;  ///< the round being stopped for (-1: none)
  bool round_stopped_sent_ = false;
  SteadyTime round_not_before_{};  ///< the earliest start the failure that asked for it allows
};

}  // namespace dflash
