#include "launcher/supervisor.h"

#include <fcntl.h>
#include <sys/epoll.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <csignal>
#include <unordered_map>

#include "common/duration.h"
#include "common/exit_codes.h"
#include "common/proc_scan.h"
#include "common/run_sweep.h"
#include "common/signal_names.h"
#include "worker/protocol.h"

namespace dflash {
namespace {

constexpr uint64_t kTagSignal = 1, kTagNotify = 2, kTagStream = 3, kTagExec = 4;
uint64_t Tag(uint64_t kind, uint64_t id) { return kind << 32 | id; }

double Seconds(SteadyTime a, SteadyTime b) { return std::chrono::duration<double>(b - a).count(); }

// The worker's X_DFLASH_GATE_* facts; a process that never took the gate has none (null).
std::string GateText(const nlohmann::json& gate, const char* k) {
  return gate.is_object() && gate.contains(k) && gate[k].is_string() ? gate[k].get<std::string>() : "";
}
double GateNumber(const nlohmann::json& gate, const char* k) {
  return gate.is_object() && gate.contains(k) && gate[k].is_number() ? gate[k].get<double>() : 0.0;
}

}  // namespace

const char* ProcStateName(ProcState s) {
  switch (s) {
    case ProcState::kNotStarted: return "NOT_STARTED";
    case ProcState::kFailed: return "FAILED";
    case ProcState::kWaiting: return "WAITING";
    case ProcState::kStarting: return "STARTING";
    case ProcState::kRunning: return "RUNNING";
    case ProcState::kBackoff: return "BACKOFF";
    case ProcState::kStopping: return "STOPPING";
    case ProcState::kExited: return "EXITED";
    case ProcState::kFatal: return "FATAL";
  }
  return "?";
}

std::vector<int> Supervisor::HandledSignals(const Plan& plan) {
  std::vector<int> s = {SIGCHLD, SIGINT, SIGTERM, SIGHUP};
  for (int f : plan.config.run.forward_signals)
    if (std::find(s.begin(), s.end(), f) == s.end()) s.push_back(f);
  return s;
}

Supervisor::Supervisor(const Plan& plan, SupervisorOptions options, Console* console,
                       std::shared_ptr<spdlog::logger> log)
    : plan_(plan), options_(std::move(options)), console_(console), log_(std::move(log)), router_(console) {
  // The role processes, then the warm-ups of roles in gate mode "warmup".
  procs_.resize(plan_.processes.size() + plan_.warmups.size());
  for (size_t i = 0; i < plan_.processes.size(); ++i) procs_[i].plan = &plan_.processes[i];
  for (size_t i = 0; i < plan_.warmups.size(); ++i) procs_[plan_.processes.size() + i].plan = &plan_.warmups[i];
  trackers_.resize(procs_.size() + plan_.config.roles.size());
  role_warm_.assign(plan_.config.roles.size(), true);
  warmup_published_.assign(plan_.config.roles.size(), false);
  for (const ProcessPlan& w : plan_.warmups) role_warm_[w.role_index] = false;
}

Supervisor::~Supervisor() = default;

void Supervisor::Info(const std::string& text) {
  if (log_) log_->info(text);
  if (console_) console_->Supervisor("[dflash] " + text);
}

void Supervisor::Warn(const std::string& text) {
  if (log_) log_->warn(text);
  if (console_) console_->Supervisor("[dflash] warning: " + text);
}

void Supervisor::SetState(Proc& p, ProcState s, const std::string& why) {
  if (p.state == s) return;
  std::string line = p.plan->name + " " + ProcStateName(p.state) + " -> " + ProcStateName(s);
  if (p.pid > 0 && s != ProcState::kBackoff) line += " (pid " + std::to_string(p.pid) + ")";
  if (!why.empty()) line += ": " + why;
  p.state = s;
  Info(line);
}

RestartTracker& Supervisor::TrackerFor(const Proc& p) {
  const RoleSpec& role = plan_.RoleOf(*p.plan);
  size_t index = role.restart.scope == RestartScope::kProcess ? static_cast<size_t>(p.plan - plan_.processes.data())
                                                              : procs_.size() + p.plan->role_index;
  if (!trackers_[index]) trackers_[index] = std::make_unique<RestartTracker>(role.restart);
  return *trackers_[index];
}

void Supervisor::AddStream(Proc& p, bool is_stderr, UniqueFd fd) {
  std::string path = plan_.AttemptPath(*p.plan, p.attempt, is_stderr ? "stderr.log" : "stdout.log");
  std::string err;
  int id = router_.Add(std::move(fd), p.plan->name, is_stderr, path, &err);
  if (id < 0) {
    Warn(p.plan->name + ": cannot log to " + path + ": " + err);
    return;
  }
  if (static_cast<size_t>(id) >= stream_owner_.size()) stream_owner_.resize(id + 1, -1);
  stream_owner_[id] = static_cast<int>(&p - procs_.data());
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.u64 = Tag(kTagStream, static_cast<uint64_t>(id));
  ::epoll_ctl(epoll_.get(), EPOLL_CTL_ADD, router_.fd(id), &ev);
  (is_stderr ? p.err_stream : p.out_stream) = id;
}

void Supervisor::CloseStream(int sid) {
  if (sid < 0 || static_cast<size_t>(sid) >= stream_owner_.size() || stream_owner_[sid] < 0) return;
  Proc& p = procs_[static_cast<size_t>(stream_owner_[sid])];
  if (p.out_stream == sid) p.out_stream = -1;
  if (p.err_stream == sid) p.err_stream = -1;
  stream_owner_[sid] = -1;
  ::epoll_ctl(epoll_.get(), EPOLL_CTL_DEL, router_.fd(sid), nullptr);
  router_.Remove(sid);
}

void Supervisor::Spawn(Proc& p) {
  const ProcessPlan& pp = *p.plan;
  const RoleSpec& role = plan_.RoleOf(pp);
  ++p.attempt;
  p.stop_sent = false;
  p.restart_pending = false;
  p.payload_pid = -1;
  p.worker_error.clear();
  p.payload_exit.clear();
  p.payload_signal = 0;
  p.gate = nlohmann::json();
  if (!p.plan->warmup && !pp.gate_key.empty() && role.warmup_gated())
    // No gate of its own: it starts after the warm-up, on the cache that one filled.
    p.gate = {{"key", pp.gate_key}, {"mode", "warmup"},
              {"role", warmup_published_[pp.role_index] ? "reuse" : "none"}};
  p.ready_s = 0;
  p.timed_out = false;
  p.readiness.reset();
  p.exit_code = -1;
  p.signal = 0;
  p.reason.clear();
  p.spawn_failed = false;
  p.state = ProcState::kStarting;

  // Could not be started: a failure of its own (FAILED, with the reason),
  // judged by its restart policy like any other exit; never "succeeded".
  auto cannot_start = [&](const std::string& why, int code) {
    p.started = std::chrono::steady_clock::now();
    p.reason = "could not be started: " + why;
    p.spawn_failed = true;
    Warn(pp.name + " " + p.reason);
    ExitStatus st;
    st.exited = true;
    st.code = code;
    OnExit(p, st);
  };
  // Each end owned at once: a second pipe2 that fails must not leak the first.
  UniqueFd out_r, out_w, err_r, err_w;
  for (auto [r, w] : {std::pair{&out_r, &out_w}, std::pair{&err_r, &err_w}}) {
    int fds[2];
    if (::pipe2(fds, O_CLOEXEC) != 0) return cannot_start(ErrnoMessage("pipe2", errno), exit_code::kFailure);
    r->reset(fds[0]);
    w->reset(fds[1]);
  }
  AddStream(p, false, std::move(out_r));  // also creates <run_dir>/attempt_<k>/
  AddStream(p, true, std::move(err_r));
  std::string cg_err;
  UniqueFd cgroup_procs = guard_.Leaf(static_cast<size_t>(&p - procs_.data()), p.attempt, &cg_err);
  if (guard_.cgroup() && !cgroup_procs) return cannot_start(cg_err, exit_code::kFailure);

  SpawnOptions so;
  so.argv = plan_.ExecArgv(pp);
  so.env = options_.base_env;
  for (const auto& [k, v] : plan_.ProcessEnv(pp, p.attempt)) SetEnvVar(&so.env, k, v);
  SetEnvVar(&so.env, "NOTIFY_SOCKET", notify_.address());  // the worker reports here, never to systemd
  SetEnvVar(&so.env, kRunTokenVar, run_token_);  // inherited by its whole tree: the guardian's marker
  so.cgroup_procs_fd = cgroup_procs ? cgroup_procs.get() : -1;
  so.cwd = role.cwd;
  so.stdout_fd = out_w.get();
  so.stderr_fd = err_w.get();
  so.group = SpawnOptions::Group::kNewSession;  // its own session and group: one kill(-pid) reaches it
  so.death_signal = SIGKILL;                    // dies with the supervisor; its payload dies with it
  so.wait_for_exec = false;                     // the next fork overlaps this exec; OnExecStatus learns

  Child child;
  std::string err;
  bool ok = dflash::Spawn(so, &child, &err);
  p.started = std::chrono::steady_clock::now();
  if (!ok) {
    if (child.pid <= 0)  // before fork (not in PATH, pipe2, fork): nothing to reap
      return cannot_start(err, child.exit_code != 0 ? child.exit_code : exit_code::kFailure);
    p.pid = child.pid;  // forked, it already exited 127/126: Reap() collects it
    p.reason = err;
    p.spawn_failed = true;
    Warn(pp.name + ": " + err);
    return;
  }
  p.pid = child.pid;
  guard_.Spawned(child.pid);  // its own session: the guardian's second marker
  p.direct = !plan_.NeedsWorker(pp);
  p.exec = std::move(child);
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.u64 = Tag(kTagExec, static_cast<uint64_t>(&p - procs_.data()));
  ::epoll_ctl(epoll_.get(), EPOLL_CTL_ADD, p.exec.exec_status.get(), &ev);
  Info(pp.name + " STARTING (pid " + std::to_string(p.pid) + ", attempt " + std::to_string(p.attempt) +
       (pp.gpu >= 0 ? ", GPU " + std::to_string(pp.gpu) : std::string(", cpu")) + ")");
  // No worker in between: readiness is judged here, by the same rules (contract/readiness.h).
  if (p.direct) p.readiness.emplace(role.ready);
}

void Supervisor::OnExecStatus(Proc& p) {
  if (!p.exec.exec_status) return;
  ::epoll_ctl(epoll_.get(), EPOLL_CTL_DEL, p.exec.exec_status.get(), nullptr);
  std::string err;
  if (!FinishSpawn(&p.exec, &err)) {
    p.reason = err;  // the child exits 127/126: Reap() reports it with this reason
    p.spawn_failed = true;
    Warn(p.plan->name + ": " + err);
    return;
  }
  // No worker in between and ready = none: running as soon as it runs.
  if (p.readiness && p.readiness->OnExec(p.started)) MarkReady(p, "started");
}

void Supervisor::MarkReady(Proc& p, const std::string& why) {
  if (p.state != ProcState::kStarting) return;
  p.ready_once = true;
  SetState(p, ProcState::kRunning, why);
  bool all = std::all_of(procs_.begin(), procs_.end(),
                         [](const Proc& q) { return q.state == ProcState::kRunning || q.state == ProcState::kExited; });
  if (all && !told_ready_) {
    told_ready_ = true;
    std::string n = std::to_string(plan_.processes.size());
    TellSystemd("READY=1\nSTATUS=all " + n + " processes running");
    Info("all " + n + " processes are running");
  }
}

int Supervisor::Run() {
  t0_ = std::chrono::steady_clock::now();
  std::string err;
  // Orphans of the workers' payloads come to us, so nothing outlives the run unseen.
  ::prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0);
  epoll_.reset(::epoll_create1(EPOLL_CLOEXEC));
  if (!epoll_ || !signals_.Open(HandledSignals(plan_), &err) || !notify_.Open(&err)) {
    start_error_ = err.empty() ? ErrnoMessage("epoll_create1", errno) : err;
    Warn("cannot start: " + start_error_);
    return exit_code::kFailure;
  }
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.u64 = Tag(kTagSignal, 0);
  ::epoll_ctl(epoll_.get(), EPOLL_CTL_ADD, signals_.fd(), &ev);
  ev.data.u64 = Tag(kTagNotify, 0);
  ::epoll_ctl(epoll_.get(), EPOLL_CTL_ADD, notify_.fd(), &ev);

  Info("run " + plan_.run_id + ": " + std::to_string(procs_.size()) + " processes, logs in " + plan_.run_dir);
  // Before the first child: the cgroup it will be born into, and the guardian
  // that kills the run if we are SIGKILLed (docs/design.md, "Nothing outlives the run").
  run_token_ = NewRunToken();
  RunGuard::Options go;
  go.token = run_token_;
  go.bin_dir = plan_.bin_dir;
  go.log_path = plan_.run_dir + "/guardian.log";
  go.mode = options_.cgroup;
  go.env = options_.base_env;
  std::vector<std::string> notes;
  if (!guard_.Start(go, &err, &notes)) {
    Warn("cannot start: " + err);
    return exit_code::kFailure;
  }
  for (const std::string& n : notes) {
    if (log_) log_->info(n);
    if (n.rfind("cannot", 0) == 0) Warn(n);
  }
  Info("run " + plan_.run_id + ": " + std::to_string(plan_.processes.size()) + " processes" +
       (plan_.warmups.empty() ? "" : " and " + std::to_string(plan_.warmups.size()) + " warm-up(s)") +
       ", logs in " + plan_.run_dir);
  // Warm-ups first: their compile is the long pole. Roles that wait for one
  // are held; every other role starts at once (a target loading a large model
  // never waits for a drafter's compile).
  for (Proc& p : procs_)
    if (!stopping_ && p.plan->warmup) Spawn(p);
  for (Proc& p : procs_) {
    if (stopping_ || p.plan->warmup) continue;
    if (HeldForWarmup(p)) SetState(p, ProcState::kWaiting, "until " + p.plan->role + ":warmup has compiled");
    else Spawn(p);
  }

  epoll_event events[64];
  while (!Done()) {
    int n = ::epoll_wait(epoll_.get(), events, 64, NextTimeoutMs());
    if (n < 0 && errno != EINTR) {
      Warn(ErrnoMessage("epoll_wait", errno));
      KillAll();
      break;
    }
    for (int i = 0; i < n; ++i) {
      uint64_t kind = events[i].data.u64 >> 32, id = events[i].data.u64 & 0xffffffff;
      if (kind == kTagSignal) {
        signalfd_siginfo si;
        while (signals_.Read(&si)) OnSignal(static_cast<int>(si.ssi_signo));
      } else if (kind == kTagNotify) {
        OnNotify();
      } else if (kind == kTagExec) {
        OnExecStatus(procs_[id]);
      } else if (kind == kTagStream) {
        int sid = static_cast<int>(id);
        // An earlier event of this batch (a child's exit) may have closed it.
        if (id >= stream_owner_.size() || stream_owner_[id] < 0) continue;
        if (!router_.OnReadable(sid)) CloseStream(sid);
      }
    }
    OnDeadlines();
    // Leftovers of processes that ended, once per turn of the loop (not once
    // per exit); while the whole run stops, once at the end.
    if (sweep_pending_ && !stopping_) SweepOrphans(false);
  }
  // Whatever the processes left behind: stop it, reap it, and the cgroup.
  FinalSweep();
  guard_.Finish();
  // Pipes still held open by a leftover writer: take what is there, then close.
  for (size_t sid = 0; sid < stream_owner_.size(); ++sid) {
    if (stream_owner_[sid] < 0) continue;
    router_.Drain(static_cast<int>(sid));
    CloseStream(static_cast<int>(sid));
  }
  TellSystemd("STOPPING=1");
  RunSummary s = Summary();
  return s.exit_code;
}

bool Supervisor::Done() const {
  for (const Proc& p : procs_)
    if (Alive(p) || p.restart_pending) return false;
  return true;
}

int Supervisor::NextTimeoutMs() const {
  SteadyTime now = std::chrono::steady_clock::now();
  SteadyTime next = SteadyTime::max();
  for (const Proc& p : procs_) {
    if (p.state == ProcState::kStopping && Alive(p)) next = std::min(next, p.kill_at);
    if (p.restart_pending && !Alive(p)) next = std::min(next, p.restart_at);
    if (p.state == ProcState::kStarting && Alive(p) && p.readiness && p.readiness->deadline())
      next = std::min(next, *p.readiness->deadline());
  }
  if (next == SteadyTime::max()) return -1;
  if (next <= now) return 0;
  // Round up: waking a millisecond early would spin once more for nothing.
  return static_cast<int>(std::chrono::ceil<Millis>(next - now).count());
}

void Supervisor::OnSignal(int sig) {
  if (sig == SIGCHLD) {
    Reap();
    return;
  }
  if (sig == SIGINT || sig == SIGTERM || sig == SIGHUP) {
    ++interrupts_;
    if (!stopping_) {
      stop_signal_ = sig;
      Info("received " + SignalName(sig) + ": stopping every process (again to kill at once)");
      BeginStop("stopped by " + SignalName(sig));
    } else if (interrupts_ > 1) {
      Info("received " + SignalName(sig) + " again: killing every process now");
      KillAll();
    }
    return;
  }
  // [run] forward_signals: pass through to every live worker (it forwards to its payload).
  for (Proc& p : procs_)
    if (Alive(p)) ::kill(-p.pid, sig);
  Info("forwarded " + SignalName(sig) + " to every process");
}

void Supervisor::Reap() {
  for (;;) {
    int status = 0;
    pid_t pid = ::waitpid(-1, &status, WNOHANG);
    if (pid <= 0) return;  // 0: none left that has exited; -1/ECHILD: no children at all
    // A worker's last words (how its payload ended) were queued before it
    // exited, so they are readable now: take them before judging its exit.
    OnNotify();
    auto it = std::find_if(procs_.begin(), procs_.end(), [&](const Proc& p) { return p.pid == pid; });
    if (it == procs_.end()) {
      if (pid == guard_.guardian_pid()) {
        guard_.GuardianReaped();
        Warn("dflash-guardian " + DecodeWaitStatus(status).Describe() +
             ": a SIGKILL of the launcher could now leave processes behind");
        continue;
      }
      if (log_) log_->debug("reaped orphan {} ({})", pid, DecodeWaitStatus(status).Describe());
      sweep_pending_ = true;  // its own children (if any) were re-parented to us
      continue;
    }
    OnExecStatus(*it);  // an exec that failed at once: its reason first
    OnExit(*it, DecodeWaitStatus(status));
  }
}

void Supervisor::OnExit(Proc& p, const ExitStatus& st) {
  SteadyTime now = std::chrono::steady_clock::now();
  p.ended = now;
  p.last_pid = p.pid;
  p.pid = -1;
  p.exit_code = st.ExitCode();
  p.signal = st.signaled ? st.signal : p.payload_signal;
  // Nothing it wrote may be left in the pipes when we decide what it said.
  for (int sid : {p.out_stream, p.err_stream})
    if (sid >= 0 && !router_.Drain(sid)) CloseStream(sid);
  std::string msg;
  p.error_message.clear();
  nlohmann::json ef = ReadErrorFile(plan_.AttemptPath(*p.plan, p.attempt, "error.json"), &msg);
  if (!ef.is_null()) p.error_message = msg;
  // The worker passes its payload's status up as its own; it also told us how
  // the payload ended (killed by SIGSEGV, not "exited with code 139").
  std::string how = !p.payload_exit.empty() && st.exited ? p.payload_exit : st.Describe();
  if (!p.worker_error.empty()) how += ": " + p.worker_error;
  else if (!p.error_message.empty()) how += ": " + p.error_message;
  else if (!p.reason.empty()) how = p.reason;  // the spawn error
  // The worker could not execute its payload: as much a start failure as ours.
  if (!p.worker_error.empty() && (p.exit_code == exit_code::kNotFound || p.exit_code == exit_code::kNotExecutable))
    p.spawn_failed = true;
  if (p.spawn_failed && how.find("exit") == std::string::npos) how += " (exit " + std::to_string(p.exit_code) + ")";
  p.reason = how;
  KillLeftoversOf(p);

  if (p.readiness) {
    p.readiness->OnExit(p.exit_code == 0);
    if (p.readiness->OnExitDrained()) p.ready_once = true;
  }
  if (p.plan->warmup && !stopping_ && !p.stop_sent) {
    OnWarmupExit(p, how);
    return;
  }
  if (p.restart_pending && !stopping_) {  // stopped because its role (or the run) restarts
    SetState(p, ProcState::kBackoff, "stopped for a restart; " + how);
    return;
  }
  if ((stopping_ || p.stop_sent) && p.spawn_failed) {
    // It failed to start on its own while the run stopped: a failure, not collateral.
    SetState(p, ProcState::kFailed, how);
    return;
  }
  if (stopping_ || p.stop_sent) {
    // Stopped by us, or ended on its own after the run began to stop (its peer
    // died and NCCL failed, say): the culprit came first, this is collateral.
    if (culprit_ >= 0 && !p.culprit) p.collateral = true;
    SetState(p, ProcState::kExited, (p.stop_sent ? "stopped; " : "") + how);
    return;
  }
  const RoleSpec& role = plan_.RoleOf(*p.plan);
  RestartDecision d = TrackerFor(p).OnExit(p.exit_code, std::chrono::duration_cast<Millis>(now - p.started), now);
  switch (d.kind) {
    case RestartDecision::Kind::kRestart: {
      SteadyTime at = now + d.delay;
      p.restart_pending = true;
      p.restart_at = at;
      for (Proc& q : procs_) {
        bool member = role.restart.scope == RestartScope::kAll ||
                      (role.restart.scope == RestartScope::kRole && q.plan->role_index == p.plan->role_index);
        // A warm-up is not restarted with its role; a process still held for
        // its warm-up starts when that is done, not at the restart.
        if (&q == &p || !member || q.plan->warmup || q.state == ProcState::kWaiting) continue;
        q.restart_pending = true;
        q.restart_at = std::max(q.restart_at, at);
        if (Alive(q))
          StopProc(q, "restarting the " + std::string(role.restart.scope == RestartScope::kAll ? "run" : "role") +
                          " after " + p.plan->name + " failed");
        else
          SetState(q, ProcState::kBackoff, "restarts with " + p.plan->name);
      }
      SetState(p, ProcState::kBackoff, how + "; " + d.reason);
      return;
    }
    case RestartDecision::Kind::kNoRestart:
      if (p.exit_code == 0) {
        SetState(p, ProcState::kExited, how);
        return;
      }
      Fail(p, how + " (" + d.reason + ")", false);
      return;
    case RestartDecision::Kind::kExhausted:
      Fail(p, how + "; " + d.reason, true);
      return;
  }
}

bool Supervisor::HeldForWarmup(const Proc& p) const {
  return !p.plan->warmup && !role_warm_[p.plan->role_index];
}

void Supervisor::OnWarmupExit(Proc& p, const std::string& how) {
  size_t ri = p.plan->role_index;
  if (p.exit_code != 0) {
    Fail(p, "warm-up failed: " + how + " (its log: " + plan_.AttemptPath(*p.plan, p.attempt, "stderr.log") + ")",
         true);
    return;
  }
  role_warm_[ri] = true;
  std::string state = GateText(p.gate, "state"), decision = GateText(p.gate, "role");
  warmup_published_[ri] = state == "ready" || decision == "reuse";
  SetState(p, ProcState::kExited,
           decision == "reuse" ? "READY was there: nothing to compile"
           : warmup_published_[ri] ? "compiled in " + FormatSeconds(GateNumber(p.gate, "compile_s")) + ", READY published"
                                   : "ended without publishing READY: the role's processes compile on their own");
  for (Proc& q : procs_)
    if (q.state == ProcState::kWaiting && q.plan->role_index == ri && !stopping_) Spawn(q);
}

void Supervisor::Fail(Proc& p, const std::string& reason, bool fatal) {
  if (culprit_ < 0) {
    culprit_ = static_cast<int>(&p - procs_.data());
    p.culprit = true;
  }
  p.reason = reason;
  if (p.pid <= 0)
    SetState(p, fatal ? ProcState::kFatal : p.spawn_failed ? ProcState::kFailed : ProcState::kExited, reason);
  BeginStop(p.plan->name + " " + reason);
}

void Supervisor::StopProc(Proc& p, const std::string& why) {
  if (!Alive(p) || p.stop_sent) return;
  // Its exec is decided within microseconds: if it failed, the process exits
  // 126/127 on its own and that is its failure, not something we stopped.
  if (p.exec.exec_status) OnExecStatus(p);
  if (p.spawn_failed) return;
  const RoleSpec& role = plan_.RoleOf(*p.plan);
  p.stop_sent = true;
  p.kill_at = std::chrono::steady_clock::now() + role.stop.grace;
  ::kill(-p.pid, role.stop.grace.count() == 0 ? SIGKILL : role.stop.signal);
  SetState(p, ProcState::kStopping, why + "; " + SignalName(role.stop.signal) + ", SIGKILL after " +
                                        FormatDuration(role.stop.grace));
}

void Supervisor::BeginStop(const std::string& reason) {
  if (stopping_) return;
  stopping_ = true;
  stop_reason_ = reason;
  TellSystemd("STOPPING=1\nSTATUS=" + reason);
  for (Proc& p : procs_) {
    p.restart_pending = false;
    if (Alive(p)) StopProc(p, "stopping the run");
    else if (p.state == ProcState::kBackoff) SetState(p, ProcState::kExited, "not restarted: the run is stopping");
    else if (p.state == ProcState::kNotStarted) p.reason = "not started: the run stopped before its turn";
    else if (p.state == ProcState::kWaiting) {
      p.reason = "not started: the run stopped before its warm-up had compiled";
      SetState(p, ProcState::kNotStarted, p.reason);
    }
  }
}

void Supervisor::KillAll() {
  for (Proc& p : procs_) {
    if (!Alive(p)) continue;
    p.stop_sent = true;
    ::kill(-p.pid, SIGKILL);
    if (p.payload_pid > 0) ::kill(-p.payload_pid, SIGKILL);
  }
  guard_.KillAll();
  SweepOrphans(true);
}

void Supervisor::KillLeftoversOf(Proc& p) {
  size_t index = static_cast<size_t>(&p - procs_.data());
  // Its cgroup leaf holds its whole tree, setsid and double-fork included.
  int64_t peak = guard_.Ended(index, p.attempt);
  p.memory_peak = std::max(p.memory_peak, peak);
  // Without cgroups, at once: its process groups (its session's first group,
  // the payload's group under a worker). The rest (own groups, setsid) are
  // orphans re-parented to us: the next sweep finds them by their marker.
  int groups = 0;
  if (p.last_pid > 0 && ::kill(-p.last_pid, SIGKILL) == 0) ++groups;
  if (p.payload_pid > 0 && ::kill(-p.payload_pid, SIGKILL) == 0) ++groups;
  if (groups > 0 && log_)
    log_->info("killing the leftovers of {} (pid {}, ended) in its process group(s)", p.plan->name, p.last_pid);
  sweep_pending_ = true;
}

std::vector<pid_t> Supervisor::SweepOrphansImpl(bool all) {
  sweep_pending_ = false;
  std::vector<pid_t> killed;
  std::vector<pid_t> children = OwnChildren();
  if (children.empty()) return killed;
  std::unordered_map<pid_t, const Proc*> by_pid;
  std::unordered_map<std::string, const Proc*> by_name;
  for (const Proc& p : procs_) {
    if (p.pid > 0) by_pid[p.pid] = &p;
    by_name[p.plan->name] = &p;
  }
  pid_t own_group = ::getpgrp();
  for (pid_t pid : children) {
    if (pid == guard_.guardian_pid() || by_pid.count(pid)) continue;
    ProcStat st;
    if (!ReadProcStat(pid, &st) || st.state == 'Z') continue;  // the reaper collects it
    // Whose is it? The environment it was exec'd with survives setsid and
    // double-fork; its session names the process it was started under.
    const Proc* owner = nullptr;
    bool same_attempt = true;
    auto token = EnvironValue(pid, kRunTokenVar);
    if (token && *token == run_token_) {
      if (auto name = EnvironValue(pid, "DFLASH_PROCESS"); name && by_name.count(*name)) owner = by_name[*name];
      if (auto attempt = EnvironValue(pid, "DFLASH_ATTEMPT"); attempt && owner)
        same_attempt = std::atoi(attempt->c_str()) == owner->attempt;
    }
    if (!owner && by_pid.count(st.sid)) owner = by_pid[st.sid];
    bool owner_alive = owner && Alive(*owner) && same_attempt;
    if (owner_alive && !all) continue;  // a live process's orphan: its own business
    std::string comm, e;
    ReadFile("/proc/" + std::to_string(pid) + "/comm", &comm, &e);
    if (!comm.empty() && comm.back() == '\n') comm.pop_back();
    std::string whose = !owner ? "an unknown process"
                        : owner_alive ? owner->plan->name + " (the run is ending)"
                        : owner->plan->name + (Alive(*owner) ? " (an earlier attempt)" : " (ended)");
    if (log_) log_->info("killing leftover {} ({}) of {}", pid, comm, whose);
    if (st.pgid > 1 && st.pgid != own_group) ::kill(-st.pgid, SIGKILL);
    ::kill(pid, SIGKILL);
    killed.push_back(pid);
  }
  return killed;
}

void Supervisor::SweepOrphans(bool all) { SweepOrphansImpl(all); }

void Supervisor::FinalSweep() {
  guard_.KillAll();
  // Killing an orphan re-parents its children to us: kill, reap, look again.
  for (int round = 0; round < 1000; ++round) {
    std::vector<pid_t> killed = SweepOrphansImpl(true);
    for (pid_t pid : killed)
      while (::waitpid(pid, nullptr, 0) < 0 && errno == EINTR) {
      }
    for (;;) {  // zombies that were already ours
      pid_t pid = ::waitpid(-1, nullptr, WNOHANG);
      if (pid <= 0) break;
      if (pid == guard_.guardian_pid()) guard_.GuardianReaped();
    }
    if (killed.empty()) break;
  }
}

void Supervisor::OnDeadlines() {
  SteadyTime now = std::chrono::steady_clock::now();
  for (Proc& p : procs_) {
    if (p.state == ProcState::kStopping && Alive(p) && now >= p.kill_at) {
      Info(p.plan->name + " still running after its grace: SIGKILL");
      ::kill(-p.pid, SIGKILL);
      if (p.payload_pid > 0) ::kill(-p.payload_pid, SIGKILL);
      p.kill_at = SteadyTime::max();
    }
    if (p.restart_pending && !Alive(p) && now >= p.restart_at && !stopping_) Spawn(p);
    if (p.state == ProcState::kStarting && Alive(p) && p.readiness && p.readiness->OnClock(now)) {
      // The worker enforces this for the processes it hosts; these are ours.
      p.timed_out = true;
      Fail(p, "(pid " + std::to_string(p.pid) + ") " + p.readiness->TimeoutText(), false);
    }
  }
}

void Supervisor::OnNotify() {
  std::vector<NotifyMessage> msgs;
  std::string err;
  if (!notify_.Receive(&msgs, &err)) Warn("notify socket: " + err);
  for (const NotifyMessage& m : msgs) {
    auto it = std::find_if(procs_.begin(), procs_.end(),
                           [&](const Proc& p) { return p.pid > 0 && (m.pid == p.pid || m.pgid == p.pid); });
    if (it == procs_.end()) continue;  // a late message from a process already gone
    Proc& p = *it;
    NotifyFields f = DecodeNotify(m.fields);  // worker/protocol.h: the worker's own encoding
    if (f.main_pid) p.payload_pid = *f.main_pid;
    if (f.error) p.worker_error = *f.error;
    if (f.payload_exit) p.payload_exit = *f.payload_exit;
    if (f.payload_signal) p.payload_signal = *f.payload_signal;
    if (f.status) Info(p.plan->name + ": " + *f.status);
    if (f.ready_s) p.ready_s = *f.ready_s;
    if (f.gate_warning && std::find(warnings_.begin(), warnings_.end(), *f.gate_warning) == warnings_.end()) {
      warnings_.push_back(*f.gate_warning);
      Warn(*f.gate_warning);
    }
    // The summary's "gate" object: the X_DFLASH_GATE_* facts, lower-cased.
    if (f.gate_key) p.gate["key"] = *f.gate_key;
    if (f.gate_role) p.gate["role"] = *f.gate_role;
    if (f.gate_wait_s) p.gate["wait_s"] = *f.gate_wait_s;
    if (f.gate_compile_s) p.gate["compile_s"] = *f.gate_compile_s;
    if (f.gate_state) {
      p.gate["state"] = GateStateName(*f.gate_state);
      ReportGate(p, GateStateName(*f.gate_state));
    }
    // A worker judged its payload itself; a direct process is judged here.
    bool ready = p.readiness ? f.ready && p.readiness->OnNotifyReady() : f.ready;
    if (ready && p.state == ProcState::kStarting) {
      if (p.direct) p.ready_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - p.started).count();
      MarkReady(p, "ready" + (p.ready_s > 0 ? " after " + FormatSeconds(p.ready_s) : ""));
      CheckReuseHitTheCache(p);
    }
  }
}


void Supervisor::ReportGate(const Proc& p, const std::string& state) {
  auto num = [&](const char* k) { return GateNumber(p.gate, k); };
  std::string key = GateText(p.gate, "key");
  if (state == "waiting") Info(p.plan->name + " gate " + key + ": waiting");
  else if (state == "leading") Info(p.plan->name + " gate " + key + ": lead, compiles for the others (waited " +
                                    FormatSeconds(num("wait_s")) + ")");
  else if (state == "reusing") Info(p.plan->name + " gate " + key + ": reuse, loads the cache (waited " +
                                    FormatSeconds(num("wait_s")) + ")");
  else if (state == "ready") Info(p.plan->name + " gate " + key + ": READY published after " +
                                  FormatSeconds(num("compile_s")));
}

void Supervisor::CheckReuseHitTheCache(Proc& p) {
  // A READY marker promises "the cache is warm for you". A reuse that still
  // compiled means the gate key misses something Inductor's key sees: say it loudly.
  if (GateText(p.gate, "role") != "reuse") return;
  nlohmann::json m = ReadErrorFile(plan_.AttemptPath(*p.plan, p.attempt, "metrics.json"), nullptr);
  if (!m.is_object() || !m.contains("fxgraph_cache_miss") || !m["fxgraph_cache_miss"].is_number()) return;
  int misses = m["fxgraph_cache_miss"].get<int>();
  if (misses <= 0) return;
  std::string w = p.plan->name + " reused gate " + GateText(p.gate, "key") + " but missed the FX graph cache " +
                  std::to_string(misses) + " time(s): the gate key does not cover something Inductor's cache key sees "
                  "(a TORCHINDUCTOR_* setting, another torch, other shapes?); it compiled on its own";
  warnings_.push_back(w);
  Warn(w);
}

void Supervisor::TellSystemd(const std::string& message) {
  if (options_.systemd_notify_socket.empty()) return;
  std::string err;
  if (!NotifySendTo(options_.systemd_notify_socket, message, &err) && log_) log_->warn("systemd notify: {}", err);
}

RunSummary Supervisor::Summary() const {
  RunSummary s;
  s.run_id = plan_.run_id;
  s.config = plan_.config.path;
  s.run_dir = plan_.run_dir;
  s.wall_s = Seconds(t0_, std::chrono::steady_clock::now());
  for (const Proc& p : procs_) {
    const ProcessPlan& pp = *p.plan;
    ProcessSummary e;
    e.name = pp.name;
    e.role = pp.role;
    e.role_rank = pp.role_rank;
    e.rank = pp.rank;
    e.device = pp.gpu >= 0 ? "cuda:" + std::to_string(pp.gpu) : "cpu";
    e.pid = p.pid > 0 ? p.pid : p.last_pid;
    e.state = ProcStateName(p.state);
    e.exit_code = p.exit_code;
    e.signal = p.signal;
    e.restarts = std::max(0, p.attempt);
    e.culprit = p.culprit;
    e.collateral = p.collateral;
    e.runtime_s = p.ended > p.started ? Seconds(p.started, p.ended) : 0;
    e.reason = p.reason;
    int attempt = std::max(0, p.attempt);
    e.stdout_log = plan_.AttemptPath(pp, attempt, "stdout.log");
    e.stderr_log = plan_.AttemptPath(pp, attempt, "stderr.log");
    std::string msg;
    e.error_file = ReadErrorFile(plan_.AttemptPath(pp, attempt, "error.json"), &msg);
    e.gate = p.gate.empty() ? nlohmann::json() : p.gate;
    e.ready_s = p.ready_s;
    e.metrics = ReadErrorFile(plan_.AttemptPath(pp, attempt, "metrics.json"), nullptr);
    e.memory_peak_bytes = p.memory_peak;
    if (pp.warmup) e.rank = -1;  // a world of one of its own, not a rank of the run
    (pp.warmup ? s.warmups : s.processes).push_back(std::move(e));
  }
  s.warnings = warnings_;
  if (culprit_ >= 0) {
    const Proc& c = procs_[static_cast<size_t>(culprit_)];
    s.culprit = c.plan->name;
    s.exit_code = c.timed_out ? exit_code::kTimeout : c.exit_code > 0 ? c.exit_code : exit_code::kFailure;
    s.reason = c.plan->name + " " + c.reason;
  } else if (!start_error_.empty()) {
    // Nothing ran: never "succeeded".
    s.exit_code = exit_code::kFailure;
    s.reason = "the supervisor could not start (" + start_error_ + "); no process was started";
  } else if (stop_signal_) {
    s.exit_code = exit_code::kSignalBase + stop_signal_;
    s.reason = stop_reason_;
  } else {
    s.exit_code = 0;
    s.reason = "all processes succeeded";
  }
  return s;
}

}  // namespace dflash
