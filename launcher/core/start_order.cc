#include "launcher/core/start_order.h"

#include <algorithm>

namespace dflash {

StartOrder::StartOrder(const Plan& plan, const std::vector<ProcessUnit>& units) : plan_(plan), units_(units) {
  role_warm_.assign(plan_.config.roles.size(), true);
  warmup_published_.assign(plan_.config.roles.size(), false);
  for (const ProcessPlan& w : plan_.warmups) role_warm_[w.role_index] = false;
}

bool StartOrder::HeldForWarmup(size_t i) const {
  const ProcessPlan& pp = units_[i].plan();
  if (pp.warmup || role_warm_[pp.role_index]) return false;
  if (units_[i].role().gate_hold() != GateHold::kOne) return true;
  // Hold one: the role's first process on this node. Its world's rendezvous cannot complete
  // without it, so the others may start now and wait there; every node holds its own first,
  // so no rank anywhere compiles before its node's warm-up has.
  for (size_t j = 0; j < i; ++j)
    if (!units_[j].plan().warmup && units_[j].plan().role_index == pp.role_index) return false;
  return true;
}

std::string StartOrder::UnreadyDependency(size_t i) const {
  for (size_t dep : units_[i].role().starts_after)
    for (const ProcessUnit& u : units_) {
      const CoreProc& q = u.view();
      if (q.plan->warmup || q.plan->role_index != dep) continue;
      // Ready: running, or ended 0 on its own (a job that prepares what the others need).
      bool done = q.state == ProcState::kExited && !q.held && q.last() && q.last()->outcome == AttemptOutcome::kSucceeded;
      if (q.state != ProcState::kRunning && !done) return plan_.config.roles[dep].name;
    }
  return "";
}

std::string StartOrder::WhyHeld(size_t i) const {
  if (HeldForWarmup(i)) return units_[i].plan().role + ":warmup has compiled";
  std::string dep = UnreadyDependency(i);
  return dep.empty() ? "" : dep + " is ready";
}

bool StartOrder::HasLiveDependents(size_t i) const {
  size_t ri = units_[i].plan().role_index;
  for (const ProcessUnit& u : units_) {
    if (!u.alive()) continue;
    const std::vector<size_t>& deps = u.role().starts_after;
    if (std::find(deps.begin(), deps.end(), ri) != deps.end()) return true;
  }
  return false;
}

bool StartOrder::OnlyServicesLeft() const {
  bool services = false, roles = false;
  for (const ProcessUnit& u : units_) {
    const CoreProc& p = u.view();
    if (u.role().service) {
      services = services || p.alive();
      continue;
    }
    roles = true;
    if (p.alive() || p.held || (p.state != ProcState::kExited && p.state != ProcState::kFailed)) return false;
  }
  return services && roles;
}

void StartOrder::WarmupDone(size_t role_index, bool published) {
  role_warm_[role_index] = true;
  warmup_published_[role_index] = published;
}

std::optional<GateRole> StartOrder::AfterWarmup(const ProcessPlan& pp) const {
  if (pp.warmup || pp.gate_key.empty() || !plan_.RoleOf(pp).warmup_gated()) return std::nullopt;
  return warmup_published_[pp.role_index] ? GateRole::kReuse : GateRole::kNone;
}

}  // namespace dflash
