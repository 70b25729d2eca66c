#include "launcher/core/process_unit.h"

#include <algorithm>
#include <csignal>

#include "common/duration.h"
#include "common/exit_codes.h"
#include "common/signal_names.h"
#include "launcher/core/gate_facts_json.h"

namespace dflash {

const char* ProcStateName(ProcState s) { return NameIn(kProcStateNames, s).data(); }  // literals: NUL-ended

const GateFacts& CoreProc::gate() const {
  static const GateFacts kNone;
  return attempts.empty() ? kNone : attempts.back().gate;
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

ProcessUnit::ProcessUnit(size_t index, const ProcessPlan& plan, const RoleSpec& role, bool direct, UnitSink* sink)
    : index_(index), role_(role), sink_(sink) {
  p_.plan = &plan;
  p_.direct = direct;
}

void ProcessUnit::Event(ProcState from, ProcState to, const std::string& why) {
  nlohmann::json e = {{"t", sink_->Since(sink_->Now())},
                      {"process", name()},
                      {"from", ProcStateName(from)},
                      {"to", ProcStateName(to)},
                      {"reason", why},
                      {"attempt", std::max(0, p_.attempt)},
                      {"pid", p_.pid > 0 ? nlohmann::json(p_.pid) : nlohmann::json()},
                      {"manual", p_.manual}};
  if (p_.last() && p_.last()->exit_code >= 0 && !p_.alive() && from != ProcState::kBackoff) {
    e["exit_code"] = p_.last()->exit_code;
    if (p_.last()->signal) e["signal"] = SignalName(p_.last()->signal);
  }
  if (!p_.gate().empty()) e["gate"] = GateFactsJson<nlohmann::json>(p_.gate());
  CoreAction a = CoreAction::For(CoreAction::Kind::kEvent, index_);
  a.event = std::move(e);
  sink_->Emit(std::move(a));
}

bool ProcessUnit::Enter(ProcState s, const std::string& why) {
  if (p_.state == s) return false;
  std::string line = name() + " " + ProcStateName(p_.state) + " -> " + ProcStateName(s);
  if (p_.pid > 0 && s != ProcState::kBackoff) line += " (pid " + std::to_string(p_.pid) + ")";
  if (!why.empty()) line += ": " + why;
  ProcState from = p_.state;
  p_.state = s;
  p_.why = why;
  Info(line);
  Event(from, s, why);
  sink_->StateChanged(index_);
  return true;
}

void ProcessUnit::Note(const std::string& why, bool by_hand) {
  bool was_manual = p_.manual;
  p_.manual = p_.manual || by_hand;
  Event(p_.state, p_.state, why);
  p_.manual = was_manual;
}

void ProcessUnit::SetOutcome(AttemptOutcome o) { p_.current().outcome = o; }

void ProcessUnit::BeginAttempt(std::optional<GateRole> after_warmup) {
  const ProcessPlan& pp = plan();
  ++p_.attempt;
  p_.intent = EndIntent::kNone;
  p_.exec_pending = false;
  p_.stop_after_exec.reset();
  p_.payload_pid = -1;
  p_.worker_error.clear();
  p_.payload_exit.clear();
  p_.payload_signal = 0;
  p_.ctl_signal = 0;
  p_.status.clear();
  p_.kill_at = p_.watchdog_at = p_.probe_at = SteadyTime::max();
  p_.probe_out = false;
  p_.probe_failures = 0;
  p_.hung_why.clear();
  // No worker in between: readiness is judged here, by the worker's rules (contract/readiness.h).
  p_.readiness.reset();
  if (p_.direct) p_.readiness.emplace(role_.ready);
  p_.watchdog_pings = false;
  p_.ready_probe = ResolveProbe(role_.ready.probe, role_, pp);
  p_.live_probe = ResolveProbe(role_.liveness.probe, role_, pp);
  p_.started = sink_->Now();
  AttemptRecord rec;
  rec.attempt = p_.attempt;
  rec.start_s = sink_->Since(p_.started);
  if (after_warmup) {
    // No gate of its own: it starts after the warm-up, on the cache that one filled.
    rec.gate.key = pp.gate_key;
    rec.gate.warmup_mode = true;
    rec.gate.role = *after_warmup;
  }
  p_.attempts.push_back(rec);
  ProcState from = p_.state;
  p_.state = ProcState::kStarting;
  p_.reason.clear();
  p_.why = p_.attempt == 0 ? "starting" : p_.manual ? "restart asked by ctl" : "restarting";
  Event(from, ProcState::kStarting, p_.why);
  p_.manual = false;
  sink_->Emit(CoreAction::For(CoreAction::Kind::kSpawn, index_));
}

void ProcessUnit::Spawned(pid_t pid) {
  const ProcessPlan& pp = plan();
  p_.pid = pid;
  p_.current().pid = pid;
  p_.exec_pending = true;
  Info(pp.name + " STARTING (pid " + std::to_string(pid) + ", attempt " + std::to_string(p_.attempt) +
       (pp.on_gpu() ? ", GPU " + pp.device : std::string(", cpu")) + ")");
}

bool ProcessUnit::SpawnFailed(const std::string& why, pid_t pid) {
  AttemptRecord& rec = p_.current();
  rec.start_failed = true;
  if (pid > 0) {  // forked, it already exited 127/126: OnExit follows when it is reaped
    p_.pid = rec.pid = pid;
    rec.reason = why;
    Warn(name() + ": " + why);
    return true;
  }
  // Could not be started: a failure of its own (FAILED, with the reason),
  // judged by its restart policy like any other exit; never "succeeded".
  rec.reason = "could not be started: " + why;
  Warn(name() + " " + rec.reason);
  return false;
}

ProcessUnit::ExecOutcome ProcessUnit::SettleExec(bool ok, const std::string& err) {
  ExecOutcome out;
  if (!p_.exec_pending) return out;  // settled already (or reaped): not judged twice
  out.settled = true;
  p_.exec_pending = false;
  std::optional<std::string> stop = std::move(p_.stop_after_exec);
  p_.stop_after_exec.reset();
  if (!ok) {
    // Its own failure, not a stop: it exits 127/126 and OnExit judges it so, with this reason.
    if (stop) p_.intent = EndIntent::kNone;
    p_.current().start_failed = true;
    p_.current().reason = err;
    Warn(name() + ": " + err);
    return out;
  }
  // No worker in between and ready = none: running as soon as it runs.
  out.ready = p_.readiness && p_.readiness->OnExec(p_.started);
  // ready = tcp/http: the first try at once (a refusal costs microseconds), then every interval.
  if (p_.readiness && p_.readiness->WantsProbe()) p_.probe_at = sink_->Now();
  out.stop = std::move(stop);
  return out;
}

const ProbeSpec* ProcessUnit::ActiveProbe(bool stopping) const {
  if (!p_.alive() || stopping || p_.intent != EndIntent::kNone) return nullptr;
  if (p_.state == ProcState::kStarting && p_.readiness && p_.readiness->WantsProbe()) return &p_.ready_probe;
  if (p_.state == ProcState::kRunning && role_.liveness.enabled) return &p_.live_probe;
  return nullptr;
}

std::optional<std::string> ProcessUnit::TakeProbe(uint64_t seq, bool answered, const std::string& detail,
                                                  bool stopping, std::string* hung) {
  if (!p_.probe_out || seq != p_.probe_seq) return std::nullopt;  // an earlier try's, or an earlier attempt's
  p_.probe_out = false;
  const ProbeSpec* probe = ActiveProbe(stopping);
  if (!probe) return std::nullopt;  // it died, is stopping, or changed state meanwhile: nothing to judge
  SteadyTime now = sink_->Now();
  p_.probe_at = now + probe->interval;
  if (p_.state == ProcState::kStarting) {
    if (!p_.readiness->OnProbe(answered, detail)) return std::nullopt;
    AttemptRecord& rec = p_.current();
    rec.ready_s = std::chrono::duration<double>(now - p_.started).count();
    p_.probe_at = SteadyTime::max();
    return "ready after " + FormatSeconds(rec.ready_s) + " (" + probe->Describe() + ": " + detail + ")";
  }
  const LivenessSpec& l = role_.liveness;
  if (answered) {
    if (p_.probe_failures > 0) Info(name() + " liveness: " + detail + " again");
    p_.probe_failures = 0;
    return std::nullopt;
  }
  ++p_.probe_failures;
  if (p_.probe_failures < l.failures) {
    Info(name() + " liveness: " + probe->Describe() + ": " + detail + " (" + std::to_string(p_.probe_failures) +
         " of " + std::to_string(l.failures) + " failed tries)");
    return std::nullopt;
  }
  p_.probe_at = SteadyTime::max();
  *hung = "liveness: " + std::to_string(p_.probe_failures) + " failed tries in a row of " + probe->Describe() +
          " (last: " + detail + ")";
  return std::nullopt;
}

bool ProcessUnit::BecomeRunning(const std::string& why) {
  if (p_.state != ProcState::kStarting) return false;
  Enter(ProcState::kRunning, why);
  ArmWatchdog();
  if (const LivenessSpec& l = role_.liveness; l.enabled) {
    p_.probe_out = false;  // a ready try still out is not liveness evidence
    p_.probe_failures = 0;
    p_.probe_at = sink_->Now() + l.probe.interval;
  }
  return true;
}

void ProcessUnit::ArmWatchdog() {
  if (role_.watchdog.count() <= 0 || p_.state != ProcState::kRunning) return;
  p_.watchdog_at = sink_->Now() + role_.watchdog;
}

void ProcessUnit::OnOutput() {
  if (!p_.watchdog_pings) ArmWatchdog();
}

void ProcessUnit::TakeReport(const NotifyFields& r) {
  if (r.main_pid) p_.payload_pid = *r.main_pid;
  if (r.error) p_.worker_error = *r.error;
  if (r.payload_exit) p_.payload_exit = *r.payload_exit;
  if (r.payload_signal) p_.payload_signal = *r.payload_signal;
  if (r.ready_s) p_.current().ready_s = *r.ready_s;
  if (r.status) {
    p_.status = *r.status;
    // In order with the log lines and events around it; the console shows it once (console.h StatusText).
    CoreAction a = CoreAction::For(CoreAction::Kind::kStatusText, index_);
    a.text = *r.status;
    sink_->Emit(std::move(a));
    if (!p_.watchdog_pings) ArmWatchdog();
  }
  if (r.watchdog) {
    p_.watchdog_pings = true;
    ArmWatchdog();
  }
}

std::optional<std::string> ProcessUnit::ReadyFrom(const NotifyFields& r) {
  bool ready = p_.readiness ? r.ready && p_.readiness->OnNotifyReady() : r.ready;
  if (!ready || p_.state != ProcState::kStarting) return std::nullopt;
  AttemptRecord& rec = p_.current();
  if (p_.direct) rec.ready_s = std::chrono::duration<double>(sink_->Now() - p_.started).count();
  return "ready" + (rec.ready_s > 0 ? " after " + FormatSeconds(rec.ready_s) : "");
}

void ProcessUnit::TakeGateFacts(const NotifyFields& r) {
  if (p_.attempts.empty()) return;
  const std::string& n = name();
  // A value its enum has no name for was set aside by DecodeNotify: say so, never guess.
  for (const std::string& line : r.ignored)
    if (line.rfind("X_DFLASH_GATE_", 0) == 0)
      Warn(n + " reported the gate fact " + line + ", which this launcher does not know (another dflash-worker "
           "version?): ignored");
  // Each fact the report carries replaces the one before; the others stay.
  GateFacts& g = p_.current().gate;
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
  Event(p_.state, p_.state, "gate " + state);  // no transition: a fact for the record
}

void ProcessUnit::Stop(EndIntent intent, const std::string& why) {
  if (!p_.alive() || p_.intent == EndIntent::kStop || p_.intent == EndIntent::kRestart) return;
  if (p_.current().start_failed) return;  // its exec failed: it exits 126/127 on its own, its own failure
  bool was_hung = p_.intent == EndIntent::kHung;
  p_.intent = intent;
  if (was_hung) return;  // its signal is sent and its SIGKILL due already
  if (p_.exec_pending) {
    // Its exec is decided within microseconds; if it failed, the process exits 126/127 on its own and
    // that is its failure, not something we stopped. The shell reads the outcome now and answers
    // OnExecResult, which sends the signal or drops the stop. Meanwhile the intent stands, so what
    // comes next (BeginStop, ctl) sees the stop as decided.
    p_.stop_after_exec = why;
    sink_->Emit(CoreAction::For(CoreAction::Kind::kSettleExec, index_));
    return;
  }
  SignalStop(why);
}

void ProcessUnit::SignalStop(const std::string& why) {
  p_.kill_at = sink_->Now() + role_.stop.grace;
  CoreAction a = CoreAction::For(CoreAction::Kind::kSignal, index_);
  a.signal = role_.stop.grace.count() == 0 ? SIGKILL : role_.stop.signal;
  sink_->Emit(std::move(a));
  Enter(ProcState::kStopping,
        why + "; " + SignalName(role_.stop.signal) + ", SIGKILL after " + FormatDuration(role_.stop.grace));
}

void ProcessUnit::Hang(const std::string& why) {
  p_.intent = EndIntent::kHung;
  p_.hung_why = why;
  p_.watchdog_at = p_.probe_at = SteadyTime::max();
  p_.kill_at = sink_->Now() + role_.stop.grace;
  CoreAction a = CoreAction::For(CoreAction::Kind::kSignal, index_);
  a.signal = role_.watchdog_signal;
  a.payload = true;  // the payload itself: its faulthandler dumps its stacks
  sink_->Emit(std::move(a));
  Enter(ProcState::kStopping, "hung: " + why + "; " + SignalName(role_.watchdog_signal) + ", SIGKILL after " +
                                  FormatDuration(role_.stop.grace));
}

void ProcessUnit::SignalByHand(int sig) {
  CoreAction a = CoreAction::For(CoreAction::Kind::kSignal, index_);
  a.signal = sig;
  sink_->Emit(std::move(a));
  p_.ctl_signal = sig;  // an end by it is a stop asked by hand, if it is a stop signal (SupervisorCore::JudgeExit)
  Info(name() + ": " + SignalName(sig) + " sent by ctl");
  Note(SignalName(sig) + " sent by ctl", /*by_hand=*/true);
}

void ProcessUnit::CountRestart(SteadyTime at) {
  p_.current().outcome = AttemptOutcome::kRestarted;
  p_.restart_at = at;
}

void ProcessUnit::MarkManual() { p_.manual = true; }

UnitDue ProcessUnit::TakeDue(SteadyTime now, bool stopping) {
  UnitDue due;
  if (p_.state == ProcState::kStopping && p_.alive() && now >= p_.kill_at) {
    Info(name() + " still running after its grace: SIGKILL");
    sink_->Emit(CoreAction::For(CoreAction::Kind::kKill, index_));
    p_.kill_at = SteadyTime::max();
  }
  due.restart = p_.state == ProcState::kBackoff && !p_.alive() && now >= p_.restart_at && !stopping && !p_.held;
  due.ready_timeout = p_.state == ProcState::kStarting && p_.alive() && p_.readiness && p_.readiness->OnClock(now);
  if (p_.state == ProcState::kRunning && p_.alive() && now >= p_.watchdog_at && !stopping)
    due.hung = std::string("no ") + (p_.watchdog_pings ? "WATCHDOG=1" : "output or STATUS=") + " for " +
               FormatDuration(role_.watchdog);
  return due;
}

void ProcessUnit::ProbeIfDue(SteadyTime now, bool stopping) {
  if (p_.probe_out || now < p_.probe_at) return;
  const ProbeSpec* probe = ActiveProbe(stopping);
  if (!probe) return;
  p_.probe_out = true;
  p_.probe_at = SteadyTime::max();
  CoreAction a = CoreAction::For(CoreAction::Kind::kProbe, index_);
  a.probe = probe;
  a.seq = ++p_.probe_seq;
  sink_->Emit(std::move(a));
}

SteadyTime ProcessUnit::NextDeadline(bool stopping) const {
  SteadyTime next = SteadyTime::max();
  if (p_.state == ProcState::kStopping && p_.alive()) next = std::min(next, p_.kill_at);
  if (p_.state == ProcState::kBackoff && !p_.alive() && !p_.held) next = std::min(next, p_.restart_at);
  if (p_.state == ProcState::kStarting && p_.alive() && p_.readiness && p_.readiness->deadline())
    next = std::min(next, *p_.readiness->deadline());
  if (p_.state == ProcState::kRunning && p_.alive()) next = std::min(next, p_.watchdog_at);
  if (p_.alive() && !p_.probe_out && p_.probe_at != SteadyTime::max() && ActiveProbe(stopping))
    next = std::min(next, p_.probe_at);
  return next;
}

bool ProcessUnit::Timed() const {
  if (!p_.alive()) return false;
  if (p_.state == ProcState::kStopping && p_.kill_at != SteadyTime::max()) return true;
  if (p_.state == ProcState::kStarting && p_.readiness && p_.readiness->deadline()) return true;
  if (p_.state == ProcState::kRunning && p_.watchdog_at != SteadyTime::max()) return true;
  return p_.state == ProcState::kRunning && role_.liveness.enabled;
}

void ProcessUnit::GiveBack(SteadyTime::duration lost) {
  if (!p_.alive()) return;
  // A grace or a readiness timeout is time the process gets: the part it
  // may not have had is given again.
  if (p_.kill_at != SteadyTime::max()) p_.kill_at += lost;
  if (p_.readiness) p_.readiness->Postpone(lost);
  // A watchdog judges silence; whether the payload was stopped with us (a
  // whole-run pause) or its pings are queued, it gets a full interval from
  // now. A payload that is really hung is still caught, one interval later.
  if (p_.state == ProcState::kRunning && p_.watchdog_at != SteadyTime::max()) ArmWatchdog();
  // Liveness, like the watchdog: tries that failed while the run was frozen prove nothing.
  if (p_.state == ProcState::kRunning && role_.liveness.enabled) {
    p_.probe_failures = 0;
    if (!p_.probe_out) p_.probe_at = sink_->Now() + role_.liveness.probe.interval;
  }
}

std::string ProcessUnit::EndAttempt(const ExitStatus& st, AttemptFiles files) {
  SteadyTime now = sink_->Now();
  AttemptRecord& rec = p_.current();
  rec.training = files.training;
  rec.metrics_unreadable = files.metrics_unreadable;
  p_.files = std::move(files);  // the last attempt's: the summary's error file and metrics
  const std::string& error_message = p_.files.error_message;
  p_.ended = now;
  p_.pid = -1;
  p_.exec_pending = false;
  // A stop held back for its exec outcome that never came: it ended first, stopped as decided
  // (the shell answers before it reports an exit, so only a harness gets here).
  p_.stop_after_exec.reset();
  p_.watchdog_at = SteadyTime::max();
  p_.kill_at = SteadyTime::max();
  rec.end_s = sink_->Since(now);
  rec.exit_code = st.ExitCode();
  rec.signal = st.signaled ? st.signal : p_.payload_signal;
  // The worker passes its payload's status up as its own; it also told us how
  // the payload ended (killed by SIGSEGV, not "exited with code 139").
  std::string how = !p_.payload_exit.empty() && st.exited ? p_.payload_exit : st.Describe();
  if (!p_.worker_error.empty()) how += ": " + p_.worker_error;
  else if (!error_message.empty()) how += ": " + error_message;
  else if (rec.start_failed && !rec.reason.empty()) how = rec.reason;  // the spawn error
  // The worker could not execute its payload: as much a start failure as ours.
  if (!p_.worker_error.empty() &&
      (rec.exit_code == exit_code::kNotFound || rec.exit_code == exit_code::kNotExecutable))
    rec.start_failed = true;
  if (rec.start_failed && how.find("exit") == std::string::npos) how += " (exit " + std::to_string(rec.exit_code) + ")";
  if (p_.intent == EndIntent::kHung) {
    how = "hung: " + p_.hung_why + "; " + how;
    rec.hung = true;
  }
  // Probed for readiness and never answered: the process died first, and the probe says what it never saw.
  if (p_.state == ProcState::kStarting && p_.readiness && p_.readiness->WantsProbe() && !rec.start_failed &&
      p_.intent == EndIntent::kNone)
    how += " before it was ready (ready = " + DescribeNotReady(p_.readiness->spec()) +
           (p_.readiness->last_probe().empty() ? "" : "; last try: " + p_.readiness->last_probe()) + ")";
  p_.probe_out = false;
  p_.probe_at = SteadyTime::max();
  // Not ready in time: the timeout is why it failed, the stop signal only how it ended.
  if (rec.ready_timeout && !p_.reason.empty()) how = p_.reason + "; " + how;
  rec.reason = how;
  p_.reason = how;
  sink_->Emit(CoreAction::For(CoreAction::Kind::kEnded, index_));
  return how;
}

void ProcessUnit::Reword(const std::string& how) { p_.current().reason = p_.reason = how; }

}  // namespace dflash
