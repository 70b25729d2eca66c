#include "launcher/supervise/supervisor_core.h"

#include <algorithm>
#include <csignal>

#include "common/duration.h"
#include "common/exit_codes.h"
#include "common/signal_names.h"
#include "launcher/supervise/gate_facts_json.h"

namespace dflash {
const char* ProcStateName(ProcState s) { return NameIn(kProcStateNames, s).data(); }  // literals: NUL-ended

const GateFacts& CoreProc::gate() const {
  static const GateFacts kNone;
  return attempts.empty() ? kNone : attempts.back().gate;
}

SupervisorCore::SupervisorCore(const Plan& plan, Clock clock) : plan_(plan), clock_(std::move(clock)) {
  // The role processes, then the warm-ups of roles in gate mode "warmup".
  procs_.resize(plan_.processes.size() + plan_.warmups.size());
  for (size_t i = 0; i < plan_.processes.size(); ++i) procs_[i].plan = &plan_.processes[i];
  for (size_t i = 0; i < plan_.warmups.size(); ++i) procs_[plan_.processes.size() + i].plan = &plan_.warmups[i];
  for (CoreProc& p : procs_) p.direct = !plan_.NeedsWorker(*p.plan);
  trackers_.resize(procs_.size() + plan_.config.roles.size() + 1);
  role_warm_.assign(plan_.config.roles.size(), true);
  warmup_published_.assign(plan_.config.roles.size(), false);
  for (const ProcessPlan& w : plan_.warmups) role_warm_[w.role_index] = false;
  t0_ = clock_();
}

SupervisorCore::~SupervisorCore() = default;

double SupervisorCore::Since(SteadyTime t) const { return std::chrono::duration<double>(t - t0_).count(); }

void SupervisorCore::Info(const std::string& text) {
  CoreAction a;
  a.kind = CoreAction::Kind::kLog;
  a.text = text;
  actions_.push_back(std::move(a));
}

void SupervisorCore::Warn(const std::string& text) {
  CoreAction a;
  a.kind = CoreAction::Kind::kLog;
  a.warn = true;
  a.text = text;
  actions_.push_back(std::move(a));
}

std::vector<CoreAction> SupervisorCore::TakeActions() {
  std::vector<CoreAction> out;
  out.swap(actions_);
  return out;
}

void SupervisorCore::Event(size_t i, ProcState from, ProcState to, const std::string& why) {
  const CoreProc& p = procs_[i];
  nlohmann::json e = {{"t", Since(Now())},
                      {"process", p.plan->name},
                      {"from", ProcStateName(from)},
                      {"to", ProcStateName(to)},
                      {"reason", why},
                      {"attempt", std::max(0, p.attempt)},
                      {"pid", p.pid > 0 ? nlohmann::json(p.pid) : nlohmann::json()},
                      {"manual", p.manual}};
  if (p.last() && p.last()->exit_code >= 0 && !p.alive() && from != ProcState::kBackoff) {
    e["exit_code"] = p.last()->exit_code;
    if (p.last()->signal) e["signal"] = SignalName(p.last()->signal);
  }
  if (!p.gate().empty()) e["gate"] = GateFactsJson<nlohmann::json>(p.gate());
  CoreAction a;
  a.kind = CoreAction::Kind::kEvent;
  a.index = i;
  a.event = std::move(e);
  actions_.push_back(std::move(a));
}

void SupervisorCore::SetState(size_t i, ProcState s, const std::string& why) {
  CoreProc& p = procs_[i];
  if (p.state == s) return;
  std::string line = p.plan->name + " " + ProcStateName(p.state) + " -> " + ProcStateName(s);
  if (p.pid > 0 && s != ProcState::kBackoff) line += " (pid " + std::to_string(p.pid) + ")";
  if (!why.empty()) line += ": " + why;
  ProcState from = p.state;
  p.state = s;
  p.why = why;
  Info(line);
  Event(i, from, s, why);
  SayIfOnlyHeldAreLeft();
}

void SupervisorCore::SayIfOnlyHeldAreLeft() {
  // By design a process stopped by ctl keeps the run up (until `ctl start` or `ctl stop all`); with nothing
  // else left, say so once, or the run looks hung (0/N running and no end).
  bool any_held = false;
  for (const CoreProc& p : procs_) {
    if (p.alive() || p.state == ProcState::kBackoff || p.state == ProcState::kWaiting) {
      told_only_held_ = false;
      return;
    }
    any_held = any_held || p.held;
  }
  if (!any_held || stopping_ || told_only_held_) return;
  told_only_held_ = true;
  Info("nothing is running: what is left was stopped by ctl and is held; `ctl start TARGET` starts it again, "
       "`ctl stop all` ends the run");
}

RestartTracker& SupervisorCore::TrackerFor(size_t i) {
  const CoreProc& p = procs_[i];
  const RoleSpec& role = plan_.RoleOf(*p.plan);
  // One budget per restart unit: a process, its role, or the run.
  size_t index = role.restart.scope == RestartScope::kProcess && role.world == TorchWorld::kNone ? i
                 : role.restart.scope == RestartScope::kAll || role.world == TorchWorld::kRun
                     ? procs_.size() + plan_.config.roles.size()
                     : procs_.size() + p.plan->role_index;
  if (!trackers_[index]) trackers_[index] = std::make_unique<RestartTracker>(role.restart);
  return *trackers_[index];
}

std::vector<size_t> SupervisorCore::RestartUnit(size_t i) const {
  const ProcessPlan& pp = *procs_[i].plan;
  const RoleSpec& role = plan_.RoleOf(pp);
  std::vector<size_t> unit;
  if (pp.warmup) return {i};
  for (size_t j = 0; j < procs_.size(); ++j) {
    const ProcessPlan& q = *procs_[j].plan;
    if (q.warmup) continue;
    const RoleSpec& qrole = plan_.RoleOf(q);
    bool member = j == i || role.restart.scope == RestartScope::kAll ||
                  ((role.restart.scope == RestartScope::kRole || role.world == TorchWorld::kRole) &&
                   q.role_index == pp.role_index) ||
                  (role.world == TorchWorld::kRun && qrole.world == TorchWorld::kRun);
    if (member) unit.push_back(j);
  }
  return unit;
}

bool SupervisorCore::HeldForWarmup(size_t i) const {
  const ProcessPlan& pp = *procs_[i].plan;
  if (pp.warmup || role_warm_[pp.role_index]) return false;
  if (plan_.RoleOf(pp).gate_hold() != GateHold::kOne) return true;
  // Hold one: the role's first process on this node. Its world's rendezvous cannot complete
  // without it, so the others may start now and wait there; every node holds its own first,
  // so no rank anywhere compiles before its node's warm-up has.
  for (size_t j = 0; j < i; ++j)
    if (!procs_[j].plan->warmup && procs_[j].plan->role_index == pp.role_index) return false;
  return true;
}

std::string SupervisorCore::UnreadyDependency(size_t i) const {
  const RoleSpec& role = plan_.RoleOf(*procs_[i].plan);
  for (size_t dep : role.starts_after)
    for (const CoreProc& q : procs_) {
      if (q.plan->warmup || q.plan->role_index != dep) continue;
      // Ready: running, or ended 0 on its own (a job that prepares what the others need).
      bool done = q.state == ProcState::kExited && !q.held && q.last() && q.last()->outcome == AttemptOutcome::kSucceeded;
      if (q.state != ProcState::kRunning && !done) return plan_.config.roles[dep].name;
    }
  return "";
}

std::string SupervisorCore::WhyHeld(size_t i) const {
  if (HeldForWarmup(i)) return procs_[i].plan->role + ":warmup has compiled";
  std::string dep = UnreadyDependency(i);
  return dep.empty() ? "" : dep + " is ready";
}

void SupervisorCore::StartOrHold(size_t i, const std::string& prefix) {
  std::string why = WhyHeld(i);
  if (why.empty()) Spawn(i);
  else SetState(i, ProcState::kWaiting, prefix + "until " + why);
}

void SupervisorCore::StartReleased() {
  if (stopping_) return;
  for (size_t j = 0; j < procs_.size(); ++j)
    if (procs_[j].state == ProcState::kWaiting && !procs_[j].held && WhyHeld(j).empty()) Spawn(j);
}

bool SupervisorCore::HasLiveDependents(size_t i) const {
  size_t ri = procs_[i].plan->role_index;
  for (const CoreProc& q : procs_) {
    if (!q.alive()) continue;
    const std::vector<size_t>& deps = plan_.RoleOf(*q.plan).starts_after;
    if (std::find(deps.begin(), deps.end(), ri) != deps.end()) return true;
  }
  return false;
}

void SupervisorCore::ContinueStop() {
  if (!stopping_) return;
  for (size_t i = 0; i < procs_.size(); ++i) {
    CoreProc& p = procs_[i];
    if (!p.stops_after_dependents || HasLiveDependents(i)) continue;
    p.stops_after_dependents = false;
    if (p.alive()) StopProc(i, EndIntent::kStop, "stopping the run; what starts after it has stopped");
  }
}

bool SupervisorCore::OnlyServicesLeft() const {
  bool services = false, roles = false;
  for (const CoreProc& p : procs_) {
    if (plan_.RoleOf(*p.plan).service) {
      services = services || p.alive();
      continue;
    }
    roles = true;
    if (p.alive() || p.held || (p.state != ProcState::kExited && p.state != ProcState::kFailed)) return false;
  }
  return services && roles;
}

void SupervisorCore::Start() {
  EventTime event_time(this);
  started_ = true;
  // Warm-ups first: their compile is the long pole. Roles that wait for one
  // (or for the roles they start after) are held; every other role starts at
  // once (a target loading a large model never waits for a drafter's compile).
  for (size_t i = 0; i < procs_.size(); ++i)
    if (!stopping_ && procs_[i].plan->warmup) StartOrHold(i);
  for (size_t i = 0; i < procs_.size(); ++i)
    if (!stopping_ && !procs_[i].plan->warmup) StartOrHold(i);
}

void SupervisorCore::Spawn(size_t i) {
  CoreProc& p = procs_[i];
  const ProcessPlan& pp = *p.plan;
  const RoleSpec& role = plan_.RoleOf(pp);
  ++p.attempt;
  p.intent = EndIntent::kNone;
  p.exec_pending = false;
  p.stop_after_exec.reset();
  p.payload_pid = -1;
  p.worker_error.clear();
  p.payload_exit.clear();
  p.payload_signal = 0;
  p.status.clear();
  p.kill_at = p.watchdog_at = p.probe_at = SteadyTime::max();
  p.probe_out = false;
  p.probe_failures = 0;
  p.hung_why.clear();
  // No worker in between: readiness is judged here, by the worker's rules (contract/readiness.h).
  p.readiness.reset();
  if (p.direct) p.readiness.emplace(role.ready);
  p.watchdog_pings = false;
  p.ready_probe = ResolveProbe(role.ready.probe, role, pp);
  p.live_probe = ResolveProbe(role.liveness.probe, role, pp);
  p.started = Now();
  AttemptRecord rec;
  rec.attempt = p.attempt;
  rec.start_s = Since(p.started);
  if (!pp.warmup && !pp.gate_key.empty() && role.warmup_gated()) {
    // No gate of its own: it starts after the warm-up, on the cache that one filled.
    rec.gate.key = pp.gate_key;
    rec.gate.warmup_mode = true;
    rec.gate.role = warmup_published_[pp.role_index] ? GateRole::kReuse : GateRole::kNone;
  }
  p.attempts.push_back(rec);
  ProcState from = p.state;
  p.state = ProcState::kStarting;
  p.reason.clear();
  p.why = p.attempt == 0 ? "starting" : p.manual ? "restart asked by ctl" : "restarting";
  Event(i, from, ProcState::kStarting, p.why);
  p.manual = false;
  CoreAction a;
  a.kind = CoreAction::Kind::kSpawn;
  a.index = i;
  actions_.push_back(std::move(a));
}

void SupervisorCore::OnSpawned(size_t i, pid_t pid, bool exec_pending) {
  EventTime event_time(this);
  CoreProc& p = procs_[i];
  const ProcessPlan& pp = *p.plan;
  p.pid = pid;
  p.current().pid = pid;
  p.exec_pending = true;
  Info(pp.name + " STARTING (pid " + std::to_string(pid) + ", attempt " + std::to_string(p.attempt) +
       (pp.on_gpu() ? ", GPU " + pp.device : std::string(", cpu")) + ")");
  if (!exec_pending) OnExecResult(i, true, "");
}

void SupervisorCore::OnSpawnFailed(size_t i, const std::string& why, int exit_code, pid_t pid) {
  EventTime event_time(this);
  CoreProc& p = procs_[i];
  AttemptRecord& rec = p.current();
  rec.start_failed = true;
  if (pid > 0) {  // forked, it already exited 127/126: OnExit follows when it is reaped
    p.pid = rec.pid = pid;
    rec.reason = why;
    Warn(p.plan->name + ": " + why);
    return;
  }
  // Could not be started: a failure of its own (FAILED, with the reason),
  // judged by its restart policy like any other exit; never "succeeded".
  rec.reason = "could not be started: " + why;
  Warn(p.plan->name + " " + rec.reason);
  ExitStatus st;
  st.exited = true;
  st.code = exit_code != 0 ? exit_code : exit_code::kFailure;
  OnExit(i, st, "");
}

void SupervisorCore::OnExecResult(size_t i, bool ok, const std::string& err) {
  EventTime event_time(this);
  CoreProc& p = procs_[i];
  if (!p.exec_pending) return;  // settled already (or reaped): not judged twice
  p.exec_pending = false;
  std::optional<std::string> stop = std::move(p.stop_after_exec);
  p.stop_after_exec.reset();
  if (!ok) {
    // Its own failure, not a stop: it exits 127/126 and OnExit judges it so, with this reason.
    if (stop) p.intent = EndIntent::kNone;
    p.current().start_failed = true;
    p.current().reason = err;
    Warn(p.plan->name + ": " + err);
    return;
  }
  // No worker in between and ready = none: running as soon as it runs.
  if (p.readiness && p.readiness->OnExec(p.started)) MarkReady(i, "started");
  // ready = tcp/http: the first try at once (a refusal costs microseconds), then every interval.
  if (p.readiness && p.readiness->WantsProbe()) p.probe_at = Now();
  if (stop) SignalStop(i, *stop);
}

const ProbeSpec* SupervisorCore::ActiveProbe(size_t i) const {
  const CoreProc& p = procs_[i];
  if (!p.alive() || stopping_ || p.intent != EndIntent::kNone) return nullptr;
  const RoleSpec& role = plan_.RoleOf(*p.plan);
  if (p.state == ProcState::kStarting && p.readiness && p.readiness->WantsProbe()) return &p.ready_probe;
  if (p.state == ProcState::kRunning && role.liveness.enabled) return &p.live_probe;
  return nullptr;
}

ProbeSpec ResolveProbe(const ProbeSpec& spec, const RoleSpec& role, const ProcessPlan& pp) {
  ProbeSpec out = spec;
  if (spec.port_name.empty()) return out;
  auto it = std::find(role.ports.begin(), role.ports.end(), spec.port_name);
  size_t k = static_cast<size_t>(it - role.ports.begin());
  out.port = it != role.ports.end() && k < pp.ports.size() ? pp.ports[k] : 0;
  std::string placeholder = "{" + spec.port_name + "}";
  if (size_t at = out.url.find(placeholder); at != std::string::npos)
    out.url.replace(at, placeholder.size(), std::to_string(out.port));
  out.port_name.clear();
  return out;
}

void SupervisorCore::OnProbeResult(size_t i, uint64_t seq, bool answered, const std::string& detail) {
  EventTime event_time(this);
  CoreProc& p = procs_[i];
  if (!p.probe_out || seq != p.probe_seq) return;  // an earlier try's, or an earlier attempt's
  p.probe_out = false;
  const ProbeSpec* probe = ActiveProbe(i);
  if (!probe) return;  // it died, is stopping, or changed state meanwhile: nothing to judge
  SteadyTime now = Now();
  p.probe_at = now + probe->interval;
  if (p.state == ProcState::kStarting) {
    if (!p.readiness->OnProbe(answered, detail)) return;
    AttemptRecord& rec = p.current();
    rec.ready_s = std::chrono::duration<double>(now - p.started).count();
    p.probe_at = SteadyTime::max();
    MarkReady(i, "ready after " + FormatSeconds(rec.ready_s) + " (" + probe->Describe() + ": " + detail + ")");
    return;
  }
  const LivenessSpec& l = plan_.RoleOf(*p.plan).liveness;
  if (answered) {
    if (p.probe_failures > 0) Info(p.plan->name + " liveness: " + detail + " again");
    p.probe_failures = 0;
    return;
  }
  ++p.probe_failures;
  if (p.probe_failures < l.failures) {
    Info(p.plan->name + " liveness: " + probe->Describe() + ": " + detail + " (" + std::to_string(p.probe_failures) +
         " of " + std::to_string(l.failures) + " failed tries)");
    return;
  }
  p.probe_at = SteadyTime::max();
  Hang(i, "liveness: " + std::to_string(p.probe_failures) + " failed tries in a row of " + probe->Describe() +
              " (last: " + detail + ")");
}

void SupervisorCore::MarkReady(size_t i, const std::string& why) {
  CoreProc& p = procs_[i];
  if (p.state != ProcState::kStarting) return;
  SetState(i, ProcState::kRunning, why);
  ArmWatchdog(i);
  if (const LivenessSpec& l = plan_.RoleOf(*p.plan).liveness; l.enabled) {
    p.probe_out = false;  // a ready try still out is not liveness evidence
    p.probe_failures = 0;
    p.probe_at = Now() + l.probe.interval;
  }
  StartReleased();  // what starts after its role may be free to go
  bool all = std::all_of(procs_.begin(), procs_.end(), [](const CoreProc& q) {
    return q.state == ProcState::kRunning || q.state == ProcState::kExited;
  });
  if (all && !told_ready_) {
    told_ready_ = true;
    std::string n = std::to_string(plan_.processes.size());
    CoreAction a;
    a.kind = CoreAction::Kind::kTellSystemd;
    a.text = "READY=1\nSTATUS=all " + n + " processes running";
    actions_.push_back(std::move(a));
    Info("all " + n + " processes are running");
  }
}

void SupervisorCore::ArmWatchdog(size_t i) {
  CoreProc& p = procs_[i];
  Millis wd = plan_.RoleOf(*p.plan).watchdog;
  if (wd.count() <= 0 || p.state != ProcState::kRunning) return;
  p.watchdog_at = Now() + wd;
}

void SupervisorCore::OnOutput(size_t i) {
  EventTime event_time(this);
  CoreProc& p = procs_[i];
  // Output is progress only for a process that never promised WATCHDOG=1.
  if (!p.watchdog_pings) ArmWatchdog(i);
}

void SupervisorCore::OnReport(size_t i, const NotifyFields& r) {
  EventTime event_time(this);
  CoreProc& p = procs_[i];
  if (r.main_pid) p.payload_pid = *r.main_pid;
  if (r.error) p.worker_error = *r.error;
  if (r.payload_exit) p.payload_exit = *r.payload_exit;
  if (r.payload_signal) p.payload_signal = *r.payload_signal;
  if (r.ready_s) p.current().ready_s = *r.ready_s;
  if (r.status) {
    p.status = *r.status;
    // In order with the log lines and events around it; the console shows it once (console.h StatusText).
    CoreAction a;
    a.kind = CoreAction::Kind::kStatusText;
    a.index = i;
    a.text = *r.status;
    actions_.push_back(std::move(a));
    if (!p.watchdog_pings) ArmWatchdog(i);
  }
  if (r.watchdog) {
    p.watchdog_pings = true;
    ArmWatchdog(i);
  }
  if (r.gate_warning) AddWarning(*r.gate_warning);
  if (!p.attempts.empty()) TakeGateFacts(i, r);
  // A worker judged its payload itself; a direct process is judged here.
  bool ready = p.readiness ? r.ready && p.readiness->OnNotifyReady() : r.ready;
  if (ready && p.state == ProcState::kStarting) {
    AttemptRecord& rec = p.current();
    if (p.direct) rec.ready_s = std::chrono::duration<double>(Now() - p.started).count();
    MarkReady(i, "ready" + (rec.ready_s > 0 ? " after " + FormatSeconds(rec.ready_s) : ""));
    if (p.gate().role == GateRole::kReuse) {
      CoreAction a;
      a.kind = CoreAction::Kind::kCheckReuse;
      a.index = i;
      actions_.push_back(std::move(a));
    }
  }
}

void SupervisorCore::TakeGateFacts(size_t i, const NotifyFields& r) {
  CoreProc& p = procs_[i];
  const std::string& n = p.plan->name;
  // A value its enum has no name for was set aside by DecodeNotify: say so, never guess.
  for (const std::string& line : r.ignored)
    if (line.rfind("X_DFLASH_GATE_", 0) == 0)
      Warn(n + " reported the gate fact " + line + ", which this launcher does not know (another dflash-worker "
           "version?): ignored");
  // Each fact the report carries replaces the one before; the others stay.
  GateFacts& g = p.current().gate;
  auto take = [](auto& fact, const auto& reported) {
    if (reported) fact = reported;
  };
  take(g.key, r.gate_key);
  take(g.role, r.gate_role);
  take(g.wait_s, r.gate_wait_s);
  take(g.compile_s, r.gate_compile_s);
  take(g.cluster, r.gate_cluster);  // the cluster-wide gate (docs/cachelock.md)
  take(g.cluster_token, r.gate_cluster_token);
  take(g.fetch_bytes, r.gate_fetch_bytes);
  take(g.fetch_s, r.gate_fetch_s);
  take(g.published_bytes, r.gate_published_bytes);
  // Dynamo's precompile: from dflash-worker, or from a warm-up mode process itself (its payload hook and
  // notify_ready()). Facts are as of READY, as dflash-worker keeps them: a direct process that compiles later
  // (a new shape at step 2) was still precompiled for the gate's purpose, so what it says after is not taken.
  // Unless it had said nothing yet: a log line's READY and the datagram before it come on different fds, and
  // the supervisor may read the line first.
  if (!(p.direct && p.state != ProcState::kStarting && g.precompile)) {
    take(g.precompiled, r.gate_precompiled);
    take(g.precompile, r.gate_precompile);
    take(g.dynamo_hits, r.gate_dynamo_hits);
  }
  take(g.state, r.gate_state);
  if (!r.gate_state) return;
  std::string key = g.key.value_or(""), state = GateStateName(*r.gate_state);
  double waited = g.wait_s.value_or(0), compiled = g.compile_s.value_or(0);
  switch (*r.gate_state) {
    case GateState::kWaiting: Info(n + " gate " + key + ": waiting"); break;
    case GateState::kLeading:
      Info(n + " gate " + key + ": lead, compiles for the others (waited " + FormatSeconds(waited) + ")");
      break;
    case GateState::kReusing:
      Info(n + " gate " + key + ": reuse, loads the cache (waited " + FormatSeconds(waited) + ")");
      break;
    case GateState::kReady: Info(n + " gate " + key + ": READY published after " + FormatSeconds(compiled)); break;
    case GateState::kUnpublished:
    case GateState::kAbandoned: break;  // the event only: the worker's warning has said why
  }
  Event(i, p.state, p.state, "gate " + state);  // no transition: a fact for the record
}

void SupervisorCore::AddWarning(const std::string& w) {
  EventTime event_time(this);
  if (std::find(warnings_.begin(), warnings_.end(), w) != warnings_.end()) return;
  warnings_.push_back(w);
  Warn(w);
}

bool SupervisorCore::OnGuardianDied(const std::string& how) {
  EventTime event_time(this);
  SteadyTime now = Now();
  guardian_deaths_.erase(std::remove_if(guardian_deaths_.begin(), guardian_deaths_.end(),
                                        [&](SteadyTime t) { return now - t > kGuardianWindow; }),
                         guardian_deaths_.end());
  guardian_deaths_.push_back(now);
  if (static_cast<int>(guardian_deaths_.size()) > kGuardianRestarts) {
    StopUnguarded("dflash-guardian " + how + "; it died " + std::to_string(guardian_deaths_.size()) +
                  " times within " + FormatDuration(kGuardianWindow) +
                  ": not started again; stopping the run, which a SIGKILL of the launcher would leave behind");
    return false;
  }
  Warn("dflash-guardian " + how + ": starting a new one (a run is never left without one)");
  return true;
}

void SupervisorCore::StopUnguarded(const std::string& why) {
  EventTime event_time(this);
  if (!unguarded_) Warn(why);
  unguarded_ = true;
  BeginStop(why);
}

void SupervisorCore::NoteMemoryPeak(size_t i, int64_t bytes) {
  procs_[i].memory_peak = std::max(procs_[i].memory_peak, bytes);
}

void SupervisorCore::OnSignal(int sig) {
  EventTime event_time(this);
  if (sig == SIGINT || sig == SIGTERM || sig == SIGHUP) {
    ++interrupts_;
    if (!stopping_) {
      stop_signal_ = sig;
      Info("received " + SignalName(sig) + ": stopping every process (again to kill at once)");
      BeginStop("stopped by " + SignalName(sig));
    } else if (interrupts_ > 1) {
      Info("received " + SignalName(sig) + " again: killing every process now");
      Abort("");
    }
    return;
  }
  // [run] forward_signals: pass through to every live worker (it forwards to its payload).
  for (size_t i = 0; i < procs_.size(); ++i) {
    if (!procs_[i].alive()) continue;
    CoreAction a;
    a.kind = CoreAction::Kind::kSignal;
    a.index = i;
    a.signal = sig;
    actions_.push_back(std::move(a));
  }
  Info("forwarded " + SignalName(sig) + " to every process");
}

void SupervisorCore::Abort(const std::string& why) {
  EventTime event_time(this);
  if (!why.empty()) Warn(why);
  for (CoreProc& p : procs_)
    if (p.alive() && p.intent != EndIntent::kStop) p.intent = EndIntent::kStop;
  if (!stopping_) BeginStop(why.empty() ? "killed" : why);
  CoreAction a;
  a.kind = CoreAction::Kind::kKillAll;
  actions_.push_back(std::move(a));
}

void SupervisorCore::StopProc(size_t i, EndIntent intent, const std::string& why) {
  CoreProc& p = procs_[i];
  if (!p.alive() || p.intent == EndIntent::kStop || p.intent == EndIntent::kRestart) return;
  if (p.current().start_failed) return;  // its exec failed: it exits 126/127 on its own, its own failure
  bool was_hung = p.intent == EndIntent::kHung;
  p.intent = intent;
  if (was_hung) return;  // its signal is sent and its SIGKILL due already
  if (p.exec_pending) {
    // Its exec is decided within microseconds; if it failed, the process exits 126/127 on its own and
    // that is its failure, not something we stopped. The shell reads the outcome now and answers
    // OnExecResult, which sends the signal or drops the stop. Meanwhile the intent stands, so what
    // comes next (BeginStop, ctl) sees the stop as decided.
    p.stop_after_exec = why;
    CoreAction a;
    a.kind = CoreAction::Kind::kSettleExec;
    a.index = i;
    actions_.push_back(std::move(a));
    return;
  }
  SignalStop(i, why);
}

void SupervisorCore::SignalStop(size_t i, const std::string& why) {
  CoreProc& p = procs_[i];
  const RoleSpec& role = plan_.RoleOf(*p.plan);
  p.kill_at = Now() + role.stop.grace;
  CoreAction a;
  a.kind = CoreAction::Kind::kSignal;
  a.index = i;
  a.signal = role.stop.grace.count() == 0 ? SIGKILL : role.stop.signal;
  actions_.push_back(std::move(a));
  SetState(i, ProcState::kStopping,
           why + "; " + SignalName(role.stop.signal) + ", SIGKILL after " + FormatDuration(role.stop.grace));
}

void SupervisorCore::Hang(size_t i, const std::string& why) {
  CoreProc& p = procs_[i];
  const RoleSpec& role = plan_.RoleOf(*p.plan);
  p.intent = EndIntent::kHung;
  p.hung_why = why;
  p.watchdog_at = p.probe_at = SteadyTime::max();
  p.kill_at = Now() + role.stop.grace;
  NoteFailure(i);
  CoreAction a;
  a.kind = CoreAction::Kind::kSignal;
  a.index = i;
  a.signal = role.watchdog_signal;
  a.payload = true;  // the payload itself: its faulthandler dumps its stacks
  actions_.push_back(std::move(a));
  SetState(i, ProcState::kStopping,
           "hung: " + why + "; " + SignalName(role.watchdog_signal) + ", SIGKILL after " +
               FormatDuration(role.stop.grace));
}

void SupervisorCore::BeginStop(const std::string& reason) {
  if (stopping_) return;
  stopping_ = true;
  stop_reason_ = reason;
  CoreAction a;
  a.kind = CoreAction::Kind::kTellSystemd;
  a.text = "STOPPING=1\nSTATUS=" + reason;
  actions_.push_back(std::move(a));
  for (size_t i = 0; i < procs_.size(); ++i) {
    CoreProc& p = procs_[i];
    if (p.alive()) {
      if (p.intent == EndIntent::kRestart) p.intent = EndIntent::kStop;
      else if (p.intent == EndIntent::kNone && HasLiveDependents(i)) {
        // Stacks stop in reverse: a server outlives its clients, so they end cleanly.
        p.stops_after_dependents = true;
        Info(p.plan->name + " stops once what starts after it has stopped");
      } else {
        StopProc(i, EndIntent::kStop, "stopping the run");
      }
    } else if (p.state == ProcState::kBackoff) {
      SetState(i, ProcState::kExited, "not restarted: the run is stopping");
    } else if (p.state == ProcState::kNotStarted) {
      p.reason = "not started: the run stopped before its turn";
    } else if (p.state == ProcState::kWaiting) {
      std::string why = WhyHeld(i);
      p.reason = "not started: the run stopped before " + (why.empty() ? "its turn" : why);
      SetState(i, ProcState::kNotStarted, p.reason);
    }
  }
}

void SupervisorCore::OnTick() {
  EventTime event_time(this);
  SteadyTime now = Now();
  for (size_t i = 0; i < procs_.size(); ++i) {
    CoreProc& p = procs_[i];
    if (p.state == ProcState::kStopping && p.alive() && now >= p.kill_at) {
      Info(p.plan->name + " still running after its grace: SIGKILL");
      CoreAction a;
      a.kind = CoreAction::Kind::kKill;
      a.index = i;
      actions_.push_back(std::move(a));
      p.kill_at = SteadyTime::max();
    }
    if (p.state == ProcState::kBackoff && !p.alive() && now >= p.restart_at && !stopping_ && !p.held)
      StartOrHold(i, "restarts ");
    if (p.state == ProcState::kStarting && p.alive() && p.readiness && p.readiness->OnClock(now)) {
      // The worker enforces this for the processes it hosts; these are ours.
      p.current().ready_timeout = true;
      NoteFailure(i);
      Fail(i, "(pid " + std::to_string(p.pid) + ") " + p.readiness->TimeoutText(), false);
    }
    if (p.state == ProcState::kRunning && p.alive() && now >= p.watchdog_at && !stopping_)
      Hang(i, std::string("no ") + (p.watchdog_pings ? "WATCHDOG=1" : "output or STATUS=") + " for " +
                  FormatDuration(plan_.RoleOf(*p.plan).watchdog));
    if (!p.probe_out && now >= p.probe_at) {
      if (const ProbeSpec* probe = ActiveProbe(i)) {
        p.probe_out = true;
        p.probe_at = SteadyTime::max();
        CoreAction a;
        a.kind = CoreAction::Kind::kProbe;
        a.index = i;
        a.probe = probe;
        a.seq = ++p.probe_seq;
        actions_.push_back(std::move(a));
      }
    }
  }
}

void SupervisorCore::OnLoopTurn(SteadyTime wait_began, SteadyTime asked, SteadyTime woke) {
  // Two ways the supervisor misses time: stopped while it waited (it wakes
  // later than it asked), or while it worked (the turn before took long).
  SteadyTime::duration late = asked == SteadyTime::max() ? SteadyTime::duration::zero() : woke - asked;
  SteadyTime::duration work =
      last_woke_ == SteadyTime{} ? SteadyTime::duration::zero() : wait_began - last_woke_;
  last_woke_ = woke;
  SteadyTime::duration lost = std::max(late, work);
  if (lost > kPauseSlack) OnPaused(lost);
}

bool SupervisorCore::Timing() const {
  for (const CoreProc& p : procs_) {
    if (!p.alive()) continue;
    if (p.state == ProcState::kStopping && p.kill_at != SteadyTime::max()) return true;
    if (p.state == ProcState::kStarting && p.readiness && p.readiness->deadline()) return true;
    if (p.state == ProcState::kRunning && p.watchdog_at != SteadyTime::max()) return true;
    if (p.state == ProcState::kRunning && plan_.RoleOf(*p.plan).liveness.enabled) return true;
  }
  return false;
}

void SupervisorCore::OnPaused(SteadyTime::duration lost) {
  EventTime event_time(this);
  ++pauses_;
  double s = std::chrono::duration<double>(lost).count();
  paused_s_ += s;
  if (!Timing()) return;  // nothing judged by time: nothing to give back
  for (CoreProc& p : procs_) {
    if (!p.alive()) continue;
    // A grace or a readiness timeout is time the process gets: the part it
    // may not have had is given again.
    if (p.kill_at != SteadyTime::max()) p.kill_at += lost;
    if (p.readiness) p.readiness->Postpone(lost);
    // A watchdog judges silence; whether the payload was stopped with us (a
    // whole-run pause) or its pings are queued, it gets a full interval from
    // now. A payload that is really hung is still caught, one interval later.
    if (p.state == ProcState::kRunning && p.watchdog_at != SteadyTime::max()) ArmWatchdog(static_cast<size_t>(&p - procs_.data()));
    // Liveness, like the watchdog: tries that failed while the run was frozen prove nothing.
    if (p.state == ProcState::kRunning && plan_.RoleOf(*p.plan).liveness.enabled) {
      p.probe_failures = 0;
      if (!p.probe_out) p.probe_at = Now() + plan_.RoleOf(*p.plan).liveness.probe.interval;
    }
  }
  Warn("the supervisor did not run for " + FormatSeconds(s) +
       " (stopped, frozen or starved): readiness and stop grace postponed by that, watchdogs re-armed; "
       "nothing is judged on time it did not see");
}

SteadyTime SupervisorCore::NextWake(SteadyTime now) const {
  SteadyTime next = NextDeadline();
  if (Timing()) next = std::min(next, now + kPauseProbe);
  return next;
}

bool SupervisorCore::Done() const {
  if (!started_) return false;
  for (const CoreProc& p : procs_) {
    if (p.alive() || p.state == ProcState::kBackoff) return false;
    // Stopped by hand: the run stays up until `ctl start` or `ctl stop all`.
    if (p.held && !stopping_) return false;
  }
  return true;
}

SteadyTime SupervisorCore::NextDeadline() const {
  SteadyTime next = SteadyTime::max();
  for (const CoreProc& p : procs_) {
    if (p.state == ProcState::kStopping && p.alive()) next = std::min(next, p.kill_at);
    if (p.state == ProcState::kBackoff && !p.alive() && !p.held) next = std::min(next, p.restart_at);
    if (p.state == ProcState::kStarting && p.alive() && p.readiness && p.readiness->deadline())
      next = std::min(next, *p.readiness->deadline());
    if (p.state == ProcState::kRunning && p.alive()) next = std::min(next, p.watchdog_at);
    if (p.alive() && !p.probe_out && p.probe_at != SteadyTime::max() &&
        ActiveProbe(static_cast<size_t>(&p - procs_.data())))
      next = std::min(next, p.probe_at);
  }
  return next;
}

int SupervisorCore::FindSender(pid_t pid, pid_t pgid) const {
  for (size_t i = 0; i < procs_.size(); ++i) {
    const CoreProc& p = procs_[i];
    if (p.pid > 0 && (pid == p.pid || pgid == p.pid)) return static_cast<int>(i);
  }
  return -1;
}

}  // namespace dflash
