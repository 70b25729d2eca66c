#include "launcher/core/control_verbs.h"

#include <algorithm>
#include <csignal>

#include "launcher/core/restart_count.h"

namespace dflash {

RunStatus ControlVerbs::Status(const RunStatus& base) const {
  RunStatus s = base;
  SteadyTime now = table_->Now();
  s.uptime_s = table_->Since(now);
  s.stopping = table_->stopping();
  for (const ProcessUnit& u : table_->units()) {
    const CoreProc& p = u.view();
    const ProcessPlan& pp = *p.plan;
    ProcessStatus e;
    e.name = pp.name;
    e.role = pp.role;
    e.rank = pp.warmup ? -1 : pp.role_rank;
    e.state = ProcStateName(p.state);
    e.pid = p.pid;
    e.payload_pid = p.alive() ? p.payload_pid : -1;
    e.gpu = pp.device;
    const GateFacts& g = p.gate();
    e.gate = g.state == GateState::kWaiting                                   ? "waiting"
             : g.role == GateRole::kLead || g.role == GateRole::kReuse ? GateRoleName(*g.role)
                                                                              : "";
    e.status = p.status;
    e.attempt = std::max(0, p.attempt);
    e.restarts = CountRestarts(p.attempts);  // one meaning: as the summary and the metrics count them
    e.held = p.held;
    e.uptime_s = p.alive() ? std::chrono::duration<double>(now - p.started).count() : 0;
    e.reason = p.why.empty() ? p.reason : p.why;
    s.processes.push_back(std::move(e));
  }
  return s;
}

void ControlVerbs::Affected(size_t i) {
  const std::string& name = table_->units()[i].name();
  for (const auto& a : affected_)
    if (a == name) return;
  affected_.push_back(name);
}

ControlReply ControlVerbs::Apply(const ControlRequest& req, const RunStatus& base) {
  ControlReply reply;
  if (req.verb == ControlVerb::kStatus) {
    reply.ok = true;
    reply.body = ToJson(Status(base));
    return reply;
  }
  std::vector<ProcessUnit>& units = table_->units();
  std::vector<std::string> names;
  for (const ProcessUnit& u : units) names.push_back(u.name());
  std::vector<size_t> targets;
  if (!ResolveTarget(req.target, names, &targets, &reply.error)) return reply;
  for (size_t i : targets)
    if (units[i].plan().warmup) {
      reply.error = units[i].name() + " is a warm-up: it runs once, before its role, and is not controlled by hand";
      return reply;
    }
  if (table_->stopping() && req.verb != ControlVerb::kSignal) {
    reply.error = "the run is stopping (" + table_->stop_reason() + ")";
    return reply;
  }
  affected_ = nlohmann::json::array();
  switch (req.verb) {
    case ControlVerb::kStatus: break;
    case ControlVerb::kSignal:
      if (!Signal(targets, req.signal, &reply.error)) return reply;
      break;
    case ControlVerb::kStop: req.target == "all" ? StopAll(targets) : Stop(WithTheirWorlds(targets)); break;
    case ControlVerb::kStart: Start(WithTheirWorlds(targets)); break;
    case ControlVerb::kRestart: Restart(targets); break;
  }
  reply.ok = true;
  reply.body = {{"affected", affected_}};
  return reply;
}

bool ControlVerbs::Signal(const std::vector<size_t>& targets, int sig, std::string* err) {
  if (sig <= 0 || sig >= NSIG) {
    *err = "no such signal: " + std::to_string(sig);
    return false;
  }
  for (size_t i : targets) {
    if (!table_->units()[i].alive()) continue;
    table_->units()[i].SignalByHand(sig);
    Affected(i);
  }
  return true;
}

void ControlVerbs::StopAll(const std::vector<size_t>& targets) {
  // The whole run ends; success unless something had failed.
  std::vector<ProcessUnit>& units = table_->units();
  for (size_t i : targets) {
    units[i].MarkManual();
    Affected(i);
  }
  // Not "all processes succeeded" later: name what a hand had stopped before it finished.
  std::string unfinished;
  for (const ProcessUnit& u : units) {
    const CoreProc& p = u.view();
    const AttemptRecord* a = p.last();
    if (p.held && !p.alive() && a && a->outcome == AttemptOutcome::kStoppedByCtl && (a->exit_code != 0 || a->signal != 0))
      unfinished += (unfinished.empty() ? "" : ", ") + u.name();
  }
  table_->Emit(CoreAction::Log("stop all asked by ctl: stopping the run"));
  table_->StopByHand("stopped by ctl (stop all)" +
                     (unfinished.empty() ? "" : "; stopped by ctl before it finished: " + unfinished));
}

std::vector<size_t> ControlVerbs::WithTheirWorlds(const std::vector<size_t>& targets) const {
  std::vector<bool> in(table_->units().size(), false);
  for (size_t i : targets)
    for (size_t j : table_->TorchWorldOf(i)) in[j] = true;
  std::vector<size_t> out;
  for (size_t j = 0; j < in.size(); ++j)
    if (in[j]) out.push_back(j);
  return out;
}

void ControlVerbs::StopRestOfWorld(size_t i, const std::string& why) {
  std::vector<size_t> rest;
  for (size_t j : table_->TorchWorldOf(i))
    if (j != i) rest.push_back(j);
  Stop(rest, why);
}

void ControlVerbs::Stop(const std::vector<size_t>& targets, const std::string& why) {
  for (size_t i : targets) {
    ProcessUnit& u = table_->units()[i];
    u.Hold();
    u.MarkManual();
    Affected(i);
    if (u.alive()) {
      if (u.intent() == EndIntent::kRestart || u.intent() == EndIntent::kHung) u.SetIntent(EndIntent::kStop);
      else u.Stop(EndIntent::kStop, why);
    } else if (u.state() == ProcState::kBackoff) {
      u.Enter(ProcState::kExited, "stopped by ctl; not restarted");
    } else {
      u.Note("held by ctl");
    }
  }
}

void ControlVerbs::Start(const std::vector<size_t>& targets) {
  SteadyTime now = table_->Now();
  for (size_t i : targets) {
    ProcessUnit& u = table_->units()[i];
    bool was_held = u.held();
    u.Release();
    if (u.alive() && u.intent() == EndIntent::kStop) {
      // Still stopping after a `ctl stop`: it starts again as soon as it has ended.
      u.SetIntent(EndIntent::kRestart);
      u.MarkManual();
      u.SetRestartAt(now);
      Affected(i);
      continue;
    }
    if (u.alive() || u.state() == ProcState::kBackoff) {
      if (was_held) Affected(i);  // released: it keeps running (or restarts as planned)
      continue;
    }
    Affected(i);
    u.MarkManual();
    table_->StartOrHold(i, "started by ctl; ");
  }
}

void ControlVerbs::Restart(const std::vector<size_t>& targets) {
  // A member of a torch world brings its world: a lone rank cannot rejoin it.
  std::vector<size_t> all;
  for (size_t i : targets)
    for (size_t j : table_->RestartUnit(i))
      if (std::find(all.begin(), all.end(), j) == all.end()) all.push_back(j);
  SteadyTime now = table_->Now();
  for (size_t j : all) {
    ProcessUnit& u = table_->units()[j];
    if (u.state() == ProcState::kWaiting) continue;  // starts when its warm-up is done
    u.Release();
    u.MarkManual();  // its end is kRestartedByCtl: never against the budget
    Affected(j);
    if (u.alive()) {
      u.SetRestartAt(now);
      // Already on its way out (hung, or stopped by hand): it comes back when it ends.
      if (u.intent() == EndIntent::kNone) u.Stop(EndIntent::kRestart, "restart asked by ctl");
      else u.SetIntent(EndIntent::kRestart);
    } else {
      table_->StartOrHold(j, "restart asked by ctl; ");
    }
  }
}

void ControlVerbs::AfterStateChange() {
  bool any_held = false;
  for (const ProcessUnit& u : table_->units()) {
    if (u.alive() || u.state() == ProcState::kBackoff || u.state() == ProcState::kWaiting) {
      told_only_held_ = false;
      return;
    }
    any_held = any_held || u.held();
  }
  if (!any_held || table_->stopping() || told_only_held_) return;
  told_only_held_ = true;
  table_->Emit(CoreAction::Log("nothing is running: what is left was stopped by ctl and is held; `ctl start "
                               "TARGET` starts it again, `ctl stop all` ends the run"));
}

}  // namespace dflash
