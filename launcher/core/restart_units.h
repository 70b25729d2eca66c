// Which processes restart together, and from which budget: a process's restart unit (RestartSpec.scope, widened
// to the torch world it shares: RoleSpec::world) and one RestartTracker (restart_policy.h) per unit. The restart
// policy's side of the core; SupervisorCore asks it and carries the answer out on the units.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "launcher/core/process_unit.h"
#include "launcher/core/restart_policy.h"
#include "launcher/plan/plan.h"

namespace dflash {

class RestartUnits {
 public:
  RestartUnits(const Plan& plan, const std::vector<ProcessUnit>& units) : plan_(plan), units_(units) {}

  /// The processes restarted together with `i` (its unit, `i` included); a warm-up is a unit of its own.
  std::vector<size_t> Members(size_t i) const;
  /// The processes of `i`'s torch world (RoleSpec::world), `i` included; `i` alone when it is in none (or is a
  /// warm-up). A rank cannot stop, start or restart without them: its peers would wait for it forever.
  std::vector<size_t> World(size_t i) const;
  /// "run", "torch world" or "role": what restarts with `i`, in words (the why of its members' BACKOFF).
  std::string What(size_t i) const;
  /// Whether `i`'s unit is wider than `i` (a scope "role"/"all", or a torch world): in store mode a round of
  /// every node, not a restart here alone.
  bool Wide(size_t i) const;
  /// `i` ended with `exit_code` at `now`: its unit's budget decides (one budget per unit: a process, its role,
  /// or the run). `zero_is_failure`: a service, whose every end is a failure.
  RestartDecision OnExit(size_t i, int exit_code, SteadyTime now, bool zero_is_failure);

 private:
  RestartTracker& TrackerFor(size_t i);

  const Plan& plan_;
  const std::vector<ProcessUnit>& units_;
  std::map<size_t, RestartTracker> trackers_;  ///< by unit: a process's index, units + role, units + roles
};

}  // namespace dflash
