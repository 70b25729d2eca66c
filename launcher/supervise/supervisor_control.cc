// SupervisorCore's live-control side (launcher/control/control.h): the status rows and
// the verbs restart, stop, start and signal. Decisions only, like the rest of
// the core: what they need done goes out as actions.
#include <algorithm>
#include <csignal>

#include "common/signal_names.h"
#include "launcher/supervise/supervisor_core.h"

namespace dflash {
RunStatus SupervisorCore::Status() {
  EventTime event_time(this);
  RunStatus s = status_base;
  SteadyTime now = Now();
  s.uptime_s = Since(now);
  s.stopping = stopping_;
  for (const CoreProc& p : procs_) {
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
    e.restarts = p.restarts;
    e.manual_restarts = p.manual_restarts;
    e.held = p.held;
    e.uptime_s = p.alive() ? std::chrono::duration<double>(now - p.started).count() : 0;
    e.reason = p.why.empty() ? p.reason : p.why;
    s.processes.push_back(std::move(e));
  }
  return s;
}

ControlReply SupervisorCore::Apply(const ControlRequest& req) {
  EventTime event_time(this);
  ControlReply reply;
  if (req.verb == ControlVerb::kStatus) {
    reply.ok = true;
    reply.body = ToJson(Status());
    return reply;
  }
  std::vector<std::string> names;
  for (const CoreProc& p : procs_) names.push_back(p.plan->name);
  std::vector<size_t> targets;
  if (!ResolveTarget(req.target, names, &targets, &reply.error)) return reply;
  for (size_t i : targets)
    if (procs_[i].plan->warmup) {
      reply.error = procs_[i].plan->name + " is a warm-up: it runs once, before its role, and is not controlled by hand";
      return reply;
    }
  if (stopping_ && req.verb != ControlVerb::kSignal) {
    reply.error = "the run is stopping (" + stop_reason_ + ")";
    return reply;
  }
  nlohmann::json affected = nlohmann::json::array();
  auto add = [&](size_t i) {
    for (const auto& a : affected)
      if (a == procs_[i].plan->name) return;
    affected.push_back(procs_[i].plan->name);
  };
  SteadyTime now = Now();
  switch (req.verb) {
    case ControlVerb::kStatus: break;
    case ControlVerb::kSignal:
      if (req.signal <= 0 || req.signal >= NSIG) {
        reply.error = "no such signal: " + std::to_string(req.signal);
        return reply;
      }
      for (size_t i : targets) {
        if (!procs_[i].alive()) continue;
        CoreAction a;
        a.kind = CoreAction::Kind::kSignal;
        a.index = i;
        a.signal = req.signal;
        actions_.push_back(std::move(a));
        Info(procs_[i].plan->name + ": " + SignalName(req.signal) + " sent by ctl");
        bool was_manual = procs_[i].manual;
        procs_[i].manual = true;  // a fact for the record, by hand
        Event(i, procs_[i].state, procs_[i].state, SignalName(req.signal) + " sent by ctl");
        procs_[i].manual = was_manual;
        add(i);
      }
      break;
    case ControlVerb::kStop:
      if (req.target == "all") {
        // The whole run ends; success unless something had failed.
        manual_stop_ = true;
        for (size_t i : targets) {
          procs_[i].manual = true;
          add(i);
        }
        // Not "all processes succeeded" later: name what a hand had stopped before it finished.
        std::string unfinished;
        for (const CoreProc& p : procs_) {
          const AttemptRecord* a = p.last();
          if (p.held && !p.alive() && a && a->outcome == AttemptOutcome::kStoppedByCtl && (a->exit_code != 0 || a->signal != 0))
            unfinished += (unfinished.empty() ? "" : ", ") + p.plan->name;
        }
        Info("stop all asked by ctl: stopping the run");
        BeginStop("stopped by ctl (stop all)" +
                  (unfinished.empty() ? "" : "; stopped by ctl before it finished: " + unfinished));
        break;
      }
      for (size_t i : targets) {
        CoreProc& p = procs_[i];
        p.held = true;
        p.manual = true;
        add(i);
        if (p.alive()) {
          if (p.intent == EndIntent::kRestart || p.intent == EndIntent::kHung) p.intent = EndIntent::kStop;
          else StopProc(i, EndIntent::kStop, "stopped by ctl");
        } else if (p.state == ProcState::kBackoff) {
          SetState(i, ProcState::kExited, "stopped by ctl; not restarted");
        } else {
          Event(i, p.state, p.state, "held by ctl");
        }
      }
      break;
    case ControlVerb::kStart:
      for (size_t i : targets) {
        CoreProc& p = procs_[i];
        bool was_held = p.held;
        p.held = false;
        if (p.alive() && p.intent == EndIntent::kStop) {
          // Still stopping after a `ctl stop`: it starts again as soon as it has ended.
          p.intent = EndIntent::kRestart;
          p.manual = true;
          p.restart_at = now;
          add(i);
          continue;
        }
        if (p.alive() || p.state == ProcState::kBackoff) {
          if (was_held) add(i);  // released: it keeps running (or restarts as planned)
          continue;
        }
        add(i);
        p.manual = true;
        StartOrHold(i, "started by ctl; ");
      }
      break;
    case ControlVerb::kRestart: {
      // A member of a torch world brings its world: a lone rank cannot rejoin it.
      std::vector<size_t> all;
      for (size_t i : targets)
        for (size_t j : RestartUnit(i))
          if (std::find(all.begin(), all.end(), j) == all.end()) all.push_back(j);
      for (size_t j : all) {
        CoreProc& q = procs_[j];
        if (q.state == ProcState::kWaiting) continue;  // starts when its warm-up is done
        q.held = false;
        q.manual = true;
        ++q.manual_restarts;  // never against the budget: no RestartTracker is asked
        add(j);
        if (q.alive()) {
          q.restart_at = now;
          // Already on its way out (hung, or stopped by hand): it comes back when it ends.
          if (q.intent == EndIntent::kNone) StopProc(j, EndIntent::kRestart, "restart asked by ctl");
          else q.intent = EndIntent::kRestart;
        } else {
          StartOrHold(j, "restart asked by ctl; ");
        }
      }
      break;
    }
  }
  reply.ok = true;
  reply.body = {{"affected", affected}};
  return reply;
}

}  // namespace dflash
