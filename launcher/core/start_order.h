// In what order the run's units may start and must stop: a role in gate mode "warmup" waits for its warm-up to
// compile (all its processes, or with hold = "one" its first), a role waits for the roles it starts after
// (`after`, services) to be ready, and a stack stops in reverse: a server outlives its clients. Reads the units;
// decides nothing else (docs/stacks.md, docs/cachelock.md "Gate modes").
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "launcher/plan/plan.h"
#include "launcher/core/process_unit.h"

namespace dflash {

class StartOrder {
 public:
  StartOrder(const Plan& plan, const std::vector<ProcessUnit>& units);

  /// Why unit `i` may not start now ("": it may): its warm-up, or a role it starts after.
  std::string WhyHeld(size_t i) const;
  /// Whether a process of a role that starts after `i`'s is still alive.
  bool HasLiveDependents(size_t i) const;
  /// Every process of a role that is not a service has ended for good (with services here to stop).
  bool OnlyServicesLeft() const;

  /// Its role's warm-up ended 0: the role is warm, and its READY is there (`published`) or not.
  void WarmupDone(size_t role_index, bool published);
  /// For a process that starts on its role's warm-up's cache (no gate of its own): whether that published READY
  /// (kReuse) or not (kNone); nullopt for any other.
  std::optional<GateRole> AfterWarmup(const ProcessPlan& pp) const;

 private:
  bool HeldForWarmup(size_t i) const;
  /// The first role `i` starts after whose processes here are not all ready, or "".
  std::string UnreadyDependency(size_t i) const;

  const Plan& plan_;
  const std::vector<ProcessUnit>& units_;
  std::vector<bool> role_warm_, warmup_published_;
};

}  // namespace dflash
