// The live-control side of a run (launcher/control/control.h): `ctl status` rows and the verbs restart, stop,
// start and signal, decided on the units and said as actions, like everything the core decides.
#pragma once

#include <string>
#include <vector>

#include "launcher/control/control.h"
#include "launcher/core/unit_table.h"

namespace dflash {

class ControlVerbs {
 public:
  explicit ControlVerbs(UnitTable* table) : table_(table) {}

  /// `base` (run id, dir, supervisor pid) with every unit's row.
  RunStatus Status(const RunStatus& base) const;
  ControlReply Apply(const ControlRequest& request, const RunStatus& base);
  /// A unit changed state. By design a process stopped by ctl keeps the run up (until `ctl start` or `ctl stop
  /// all`): with nothing else left, it says so once, or the run looks hung (0/N running and no end).
  void AfterStateChange();
  /// Unit `i` ended by a stop that `ctl signal` asked of its torch world (`why`): the rest of its world is held as
  /// by `ctl stop`, the live ones stopped, so none restarts or waits for a peer held by hand.
  void StopRestOfWorld(size_t i, const std::string& why);

 private:
  bool Signal(const std::vector<size_t>& targets, int sig, std::string* err);
  void StopAll(const std::vector<size_t>& targets);
  void Stop(const std::vector<size_t>& targets, const std::string& why = "stopped by ctl");
  void Start(const std::vector<size_t>& targets);
  /// `targets` with the rest of each one's torch world, in the table's order: a rank stops and starts with its
  /// peers, or they wait for it forever.
  std::vector<size_t> WithTheirWorlds(const std::vector<size_t>& targets) const;
  void Restart(const std::vector<size_t>& targets);
  /// Unit `i` was affected (once in the reply).
  void Affected(size_t i);

  UnitTable* table_;
  nlohmann::json affected_;
  bool told_only_held_ = false;  ///< said that only processes held by ctl are left
};

}  // namespace dflash
