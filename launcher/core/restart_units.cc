#include "launcher/core/restart_units.h"

namespace dflash {

std::vector<size_t> RestartUnits::Members(size_t i) const {
  const ProcessPlan& pp = units_[i].plan();
  const RoleSpec& role = units_[i].role();
  std::vector<size_t> unit;
  if (pp.warmup) return {i};
  for (size_t j = 0; j < units_.size(); ++j) {
    const ProcessPlan& q = units_[j].plan();
    if (q.warmup) continue;
    const RoleSpec& qrole = units_[j].role();
    bool member = j == i || role.restart.scope == RestartScope::kAll ||
                  ((role.restart.scope == RestartScope::kRole || role.world == TorchWorld::kRole) &&
                   q.role_index == pp.role_index) ||
                  (role.world == TorchWorld::kRun && qrole.world == TorchWorld::kRun);
    if (member) unit.push_back(j);
  }
  return unit;
}

std::vector<size_t> RestartUnits::World(size_t i) const {
  const ProcessPlan& pp = units_[i].plan();
  const TorchWorld world = units_[i].role().world;
  if (pp.warmup || world == TorchWorld::kNone) return {i};
  std::vector<size_t> members;
  for (size_t j = 0; j < units_.size(); ++j) {
    const ProcessPlan& q = units_[j].plan();
    if (q.warmup) continue;
    if (world == TorchWorld::kRole ? q.role_index == pp.role_index : units_[j].role().world == TorchWorld::kRun)
      members.push_back(j);
  }
  return members;
}

std::string RestartUnits::What(size_t i) const {
  const RoleSpec& role = units_[i].role();
  return role.restart.scope == RestartScope::kAll ? "run"
         : role.world != TorchWorld::kNone       ? "torch world"
                                                 : "role";
}

bool RestartUnits::Wide(size_t i) const {
  const RoleSpec& role = units_[i].role();
  return role.restart.scope != RestartScope::kProcess || role.world != TorchWorld::kNone;
}

RestartTracker& RestartUnits::TrackerFor(size_t i) {
  const ProcessUnit& u = units_[i];
  const RoleSpec& role = u.role();
  // One budget per restart unit: a process, its role, or the run.
  size_t index = role.restart.scope == RestartScope::kProcess && role.world == TorchWorld::kNone ? i
                 : role.restart.scope == RestartScope::kAll || role.world == TorchWorld::kRun
                     ? units_.size() + plan_.config.roles.size()
                     : units_.size() + u.plan().role_index;
  return trackers_.try_emplace(index, role.restart).first->second;
}

RestartDecision RestartUnits::OnExit(size_t i, int exit_code, SteadyTime now, bool zero_is_failure) {
  const CoreProc& p = units_[i].view();
  return TrackerFor(i).OnExit(exit_code, std::chrono::duration_cast<Millis>(now - p.started), now, zero_is_failure);
}

}  // namespace dflash
