// The supervisor's hands: what the core decided (CoreAction, launcher/core/core_action.h) carried out in
// order, each action with the OS call or the shell's part that does it.
#include <csignal>
#include <optional>

#include "launcher/supervise/pid_claim.h"
#include "launcher/supervise/probe_runner.h"
#include "launcher/supervise/supervisor_internal.h"

namespace dflash {

void Supervisor::Impl::Drain() {
  // Executing one action may feed the core an event (a spawn that failed), which
  // queues more: run until none is left, in order.
  while (core_.HasActions())
    for (const CoreAction& a : core_.TakeActions()) Execute(a);
  // The culprit is this node's: every other node must hear of it now, not when we have stopped.
  if (core_.culprit() >= 0 && !failure_told_ && options_.on_failure) {
    failure_told_ = true;
    options_.on_failure(core_.view(static_cast<size_t>(core_.culprit())).plan->name, core_.ExitCode(),
                        core_.CulpritReason());
  }
}

void Supervisor::Impl::Execute(const CoreAction& a) {
  using K = CoreAction::Kind;
  std::optional<ProcView> p;  // as the action found it; read again after an event (kSettleExec)
  if (a.index < core_.size()) p = core_.view(a.index);
  switch (a.kind) {
    case K::kSpawn: DoSpawn(a.index); break;
    case K::kSignal:
      if (!p || !p->alive()) break;
      // A watchdog's signal goes to the payload (its faulthandler), not to the worker.
      if (!a.payload || !SignalVerified(os_[a.index].payload, a.signal)) ::kill(-p->pid, a.signal);
      break;
    case K::kKill:
      if (!p || !p->alive()) break;
      ::kill(-p->pid, SIGKILL);
      SignalVerified(os_[a.index].payload, SIGKILL);
      break;
    case K::kEnded: Ended(a.index); break;
    case K::kKillAll: KillAll(); break;
    case K::kTellSystemd: TellSystemd(a.text); break;
    case K::kLog: a.warn ? Warn(a.text) : Info(a.text); break;
    case K::kEvent: WriteEvent(a.event); break;
    case K::kCheckReuse: CheckReuseHitTheCache(a.index); break;
    case K::kRoundRequest:
      if (options_.on_round_request) options_.on_round_request(static_cast<int>(a.index), a.text);
      break;
    case K::kRoundStopped:
      if (options_.on_round_stopped) options_.on_round_stopped(static_cast<int>(a.index));
      break;
    case K::kProbe:
      // A port reserved for the process (ports = [...]) counts only if its listener is the process's own.
      if (a.probe)
        probes_->Start(a.index, a.seq, *a.probe, std::chrono::steady_clock::now(),
                       p && ReservedFor(*p->plan, a.probe->port) ? p->pid : -1);
      break;
    // A stop the core holds back until it knows whether the exec failed: the answer (OnExecResult) comes
    // now, before any other event; its actions follow this batch, in order.
    case K::kSettleExec:
      OnExecStatus(a.index);
      // No status left to read (it cannot happen: the core asks only while one is pending): never leave the
      // stop waiting.
      if (p && core_.view(a.index).exec_pending) core_.OnExecResult(a.index, true, "");
      break;
    case K::kStatusText:
      if (!p) break;
      if (log_) log_->info("{}: {}", p->plan->name, a.text);
      if (console_) console_->StatusText(p->plan->name, a.text);
      break;
  }
}

}  // namespace dflash
