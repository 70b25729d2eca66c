// Who, off this node's processes, a run is stopped for (store mode: another node, the store, a round; node 0's
// private store), as facts. Only the verdict names it (NodeCulpritName, incident.cc): summary.json's "culprit",
// the console's last line and the exit status all say that one name (docs/multinode.md).
#pragma once

#include <string>

#include <nlohmann/json.hpp>

#include "common/exit_codes.h"

namespace dflash {

struct NodeCulprit {
  enum class Kind {
    kNodeFailed,    ///< a process of node `node` failed (`process`, or "" when the store did not say which)
    kNodeLost,      ///< node `node`'s launcher was lost: its registration expired
    kNodeReplaced,  ///< another launcher registered as node `node`
    kLeftBehind,    ///< this node (`node`): the run moved on without it
    kStore,         ///< the coordination store stayed unreachable
    kPrivateStore,  ///< the run's private store (node 0's redis-server) ended
    kRound,         ///< restart round `round` could not complete
  };
  Kind kind = Kind::kNodeFailed;
  int node = -1;
  std::string process;
  int round = -1;
};

/// "node 1: w:3", "node 1 (launcher lost)", "node 1 (replaced)", "node 2 (left behind)", "the store",
/// "node 0 (its private store)", "round 3".
std::string NodeCulpritName(const NodeCulprit& c);

/// A stop of the run for a NodeCulprit (SupervisorCore::StopForNode): why, the run's exit code, and the
/// failure as the store had it (summary.json's node_culprit, or null).
struct NodeStop {
  NodeCulprit culprit;
  std::string reason;
  int exit_code = exit_code::kNodeFailed;
  nlohmann::json record;
};

}  // namespace dflash
