#include "launcher/supervise/supervisor.h"

#include <fcntl.h>
#include <sys/epoll.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <csignal>
#include <ctime>

#include "common/duration.h"
#include "common/exit_codes.h"
#include "common/fd.h"
#include "common/hash.h"
#include "common/notify.h"
#include "common/proc_scan.h"
#include "common/run_sweep.h"
#include "common/signal_fd.h"
#include "common/signal_names.h"
#include "common/spawn.h"
#include "contract/process_env.h"
#include "launcher/console/log_router.h"
#include "launcher/supervise/orphan_owner.h"
#include "launcher/supervise/payload_files.h"
#include "launcher/supervise/pid_claim.h"
#include "launcher/supervise/probe_runner.h"
#include "launcher/supervise/reuse_audit.h"
#include "launcher/supervise/supervisor_core.h"
#include "launcher/supervise/supervisor_summary.h"
#include "worker/protocol.h"

namespace dflash {
namespace {

constexpr uint64_t kTagSignal = 1, kTagNotify = 2, kTagStream = 3, kTagExec = 4, kTagWatch = 5, kTagProbe = 6;
uint64_t Tag(uint64_t kind, uint64_t id) { return kind << 32 | id; }

LogRouter::Options RouterOptions(const Plan& plan) {
  LogRouter::Options o;
  o.files = plan.Files();
  return o;
}

/// How often, at least, the console's live status is refreshed.
constexpr Millis kStatusPeriod{1000};

}  // namespace

struct Supervisor::Impl : public ControlHandler {
  Impl(const Plan& plan, SupervisorOptions options, Console* console, std::shared_ptr<spdlog::logger> log)
      : plan_(plan),
        options_(std::move(options)),
        console_(console),
        log_(std::move(log)),
        core_(plan, [] { return std::chrono::steady_clock::now(); }),
        router_(console, RouterOptions(plan)) {
    os_.resize(core_.size());
    core_.node_rounds = options_.node_rounds;
    epoll_.reset(::epoll_create1(EPOLL_CLOEXEC));
    probes_ = std::make_unique<ProbeRunner>(epoll_.get(), Tag(kTagProbe, 0));
    core_.status_base.run_id = plan_.run_id;
    core_.status_base.run_dir = plan_.run_dir;
    core_.status_base.supervisor_pid = static_cast<int>(::getpid());
  }

  // ControlHandler: the core answers; what it decided is carried out at once.
  RunStatus Status() override { return core_.Status(); }
  ControlReply Apply(const ControlRequest& request) override {
    ControlReply r = core_.Apply(request);
    Drain();
    return r;
  }

  /// The OS side of each process: its pipes and its exec's outcome.
  struct Os {
    int out_stream = -1, err_stream = -1;
    Child exec;  // until OnExecStatus reads its outcome
    VerifiedPid payload;  // its MAINPID=, once checked (launcher/supervise/pid_claim.h)
  };

  int Run();
  void Drain();
  void Execute(const CoreAction& a);
  void DoSpawn(size_t i);
  void OnExecStatus(size_t i);
  void Reap();
  void OnNotify();
  void CheckMainPid(size_t i, NotifyFields* f);
  void Ended(size_t i);
  void KillAll();
  void CheckReuseHitTheCache(size_t i);
  void AddStream(size_t i, bool is_stderr, UniqueFd fd);
  void CloseStream(int sid);
  void SweepOrphans(bool all) { SweepOrphansImpl(all); }
  std::vector<pid_t> SweepOrphansImpl(bool all);
  void FinalSweep();
  void TellSystemd(const std::string& message);
  void WriteEvent(nlohmann::json event);
  void PublishStatus(bool force);
  /// The epoll timeout from `now`; `asked`: the wake-up it stands for.
  int NextTimeoutMs(SteadyTime now, SteadyTime* asked) const;
  void Dispatch(const epoll_event* events, int n);
  /// Tries that ended go to the core -- after any exit already waiting is
  /// reaped, so an answer that came after its process died never counts.
  void DeliverProbes();
  void TakeQueued(epoll_event* events);
  void Info(const std::string& text) {
    if (log_) log_->info(text);
    if (console_) console_->Supervisor("[dflash] " + text);
  }
  void Warn(const std::string& text) {
    if (log_) log_->warn(text);
    if (console_) console_->Supervisor("[dflash] warning: " + text);
  }

  const Plan& plan_;
  SupervisorOptions options_;
  Console* console_;
  std::shared_ptr<spdlog::logger> log_;
  SupervisorCore core_;
  LogRouter router_;
  SignalFd signals_;
  NotifyListener notify_;
  UniqueFd epoll_;
  UniqueFd events_file_;  // <run_dir>/events.jsonl
  std::unique_ptr<ProbeRunner> probes_;  // ready = tcp/http, liveness (after epoll_)
  std::vector<Os> os_;
  std::vector<int> stream_owner_;  // stream id -> proc index
  std::vector<std::function<void()>> watches_;
  std::vector<int> watch_fds_;
  RunGuard guard_;
  std::string run_token_;       // DFLASH_RUN_TOKEN of every process of this run
  std::string start_error_;     // Run() could not even set up its loop (fds exhausted, say)
  bool sweep_pending_ = false;  // a process or orphan ended since the last SweepOrphans
  bool failure_told_ = false;   // on_failure was called
  bool status_dirty_ = true;
  SteadyTime last_status_{};
  SteadyTime t0_ = std::chrono::steady_clock::now();
};

void Supervisor::Impl::Drain() {
  // Executing one action may feed the core an event (a spawn that failed), which
  // queues more: run until none is left, in order.
  while (core_.HasActions())
    for (const CoreAction& a : core_.TakeActions()) Execute(a);
  // The culprit is this node's: every other node must hear of it now, not when we have stopped.
  if (core_.culprit() >= 0 && !failure_told_ && options_.on_failure) {
    failure_told_ = true;
    const CoreProc& c = core_.proc(static_cast<size_t>(core_.culprit()));
    const AttemptRecord* a = core_.culprit_attempt();
    options_.on_failure(c.plan->name, core_.ExitCode(), a ? a->reason : c.reason);
  }
}

void Supervisor::Impl::Execute(const CoreAction& a) {
  using K = CoreAction::Kind;
  const CoreProc* p = a.index < core_.size() ? &core_.proc(a.index) : nullptr;
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
      if (p && p->exec_pending) core_.OnExecResult(a.index, true, "");
      break;
    case K::kStatusText:
      if (!p) break;
      if (log_) log_->info("{}: {}", p->plan->name, a.text);
      if (console_) console_->StatusText(p->plan->name, a.text);
      break;
  }
}

void Supervisor::Impl::WriteEvent(nlohmann::json event) {
  status_dirty_ = true;
  if (!events_file_) return;
  struct timespec ts;
  ::clock_gettime(CLOCK_REALTIME, &ts);
  event["time"] = static_cast<double>(ts.tv_sec) + ts.tv_nsec / 1e9;
  std::string line = event.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) + "\n";
  // One write per line on an O_APPEND fd: a reader never sees half a line.
  std::string werr;
  if (!WriteAll(events_file_.get(), line, &werr) && log_)
    log_->warn("cannot write events.jsonl: {}", werr);
}

void Supervisor::Impl::PublishStatus(bool force) {
  if (!console_) return;
  SteadyTime now = std::chrono::steady_clock::now();
  if (!force && !status_dirty_ && now - last_status_ < kStatusPeriod) return;
  status_dirty_ = false;
  last_status_ = now;
  console_->SetStatus(core_.Status());
}

void Supervisor::Impl::AddStream(size_t i, bool is_stderr, UniqueFd fd) {
  const CoreProc& p = core_.proc(i);
  std::string path = plan_.AttemptPath(*p.plan, p.attempt, is_stderr ? "stderr.log" : "stdout.log");
  std::string err;
  int id = router_.Add(std::move(fd), p.plan->name, is_stderr, path, &err);
  // Loud (console, supervisor.log, summary.json) but never fatal: the pipe is still drained (console only).
  if (!err.empty())
    core_.AddWarning(p.plan->name + ": cannot log to " + path + ": " + err +
                     (id >= 0 ? "; its output is shown on the console only" : ""));
  if (id < 0) return;
  if (static_cast<size_t>(id) >= stream_owner_.size()) stream_owner_.resize(id + 1, -1);
  stream_owner_[id] = static_cast<int>(i);
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.u64 = Tag(kTagStream, static_cast<uint64_t>(id));
  ::epoll_ctl(epoll_.get(), EPOLL_CTL_ADD, router_.fd(id), &ev);
  (is_stderr ? os_[i].err_stream : os_[i].out_stream) = id;
}

void Supervisor::Impl::CloseStream(int sid) {
  if (sid < 0 || static_cast<size_t>(sid) >= stream_owner_.size() || stream_owner_[sid] < 0) return;
  Os& o = os_[static_cast<size_t>(stream_owner_[sid])];
  if (o.out_stream == sid) o.out_stream = -1;
  if (o.err_stream == sid) o.err_stream = -1;
  stream_owner_[sid] = -1;
  ::epoll_ctl(epoll_.get(), EPOLL_CTL_DEL, router_.fd(sid), nullptr);
  router_.Remove(sid);
}

void Supervisor::Impl::DoSpawn(size_t i) {
  const CoreProc& p = core_.proc(i);
  const ProcessPlan& pp = *p.plan;
  const RoleSpec& role = plan_.RoleOf(pp);
  // Each end owned at once: a second pipe2 that fails must not leak the first.
  UniqueFd out_r, out_w, err_r, err_w;
  for (auto [r, w] : {std::pair{&out_r, &out_w}, std::pair{&err_r, &err_w}}) {
    int fds[2];
    if (::pipe2(fds, O_CLOEXEC) != 0)
      return core_.OnSpawnFailed(i, ErrnoMessage("pipe2", errno), exit_code::kFailure);
    r->reset(fds[0]);
    w->reset(fds[1]);
  }
  AddStream(i, false, std::move(out_r));  // also creates <run_dir>/attempt_<k>/
  AddStream(i, true, std::move(err_r));
  std::string cg_err;
  UniqueFd cgroup_procs = guard_.Leaf(i, p.attempt, &cg_err);
  if (guard_.cgroup() && !cgroup_procs) return core_.OnSpawnFailed(i, cg_err, exit_code::kFailure);

  SpawnOptions so;
  so.argv = plan_.ExecArgv(pp);
  SpawnContext ctx;
  ctx.notify_socket = notify_.address();
  ctx.run_token = run_token_;  // inherited by its whole tree: the guardian's marker
  so.env = SpawnEnvironment(options_.base_env, plan_.ProcessEnv(pp, p.attempt, &ctx));
  // A warm-up-mode process takes no gate (no dflash-worker sets this), but it does reuse the warm-up's
  // cache: dflash_launch.gate_role() says so, as the console does.
  if (p.gate().warmup_mode && p.gate().role == GateRole::kReuse)
    SetEnvVar(&so.env, env::kGateRole, "reuse");
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
  if (!ok) {
    if (child.pid <= 0)  // before fork (not in PATH, pipe2, fork): nothing to reap
      return core_.OnSpawnFailed(i, err, child.exit_code != 0 ? child.exit_code : exit_code::kFailure);
    // Forked, it already exited 127/126: Reap() collects it.
    return core_.OnSpawnFailed(i, err, child.exit_code, child.pid);
  }
  guard_.Spawned(child.pid);  // its own session: the guardian's second marker
  pid_t pid = child.pid;
  os_[i].exec = std::move(child);
  os_[i].payload = VerifiedPid{};
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.u64 = Tag(kTagExec, static_cast<uint64_t>(i));
  ::epoll_ctl(epoll_.get(), EPOLL_CTL_ADD, os_[i].exec.exec_status.get(), &ev);
  core_.OnSpawned(i, pid, /*exec_pending=*/true);
}

void Supervisor::Impl::OnExecStatus(size_t i) {
  Os& o = os_[i];
  if (!o.exec.exec_status) return;
  ::epoll_ctl(epoll_.get(), EPOLL_CTL_DEL, o.exec.exec_status.get(), nullptr);
  std::string err;
  bool ok = FinishSpawn(&o.exec, &err);
  core_.OnExecResult(i, ok, err);
}

int Supervisor::Impl::Run() {
  t0_ = std::chrono::steady_clock::now();
  std::string err;
  // Orphans of the workers' payloads come to us, so nothing outlives the run unseen.
  ::prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0);
  if (!epoll_ || !signals_.Open(Supervisor::HandledSignals(plan_), &err) || !notify_.Open(&err)) {
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
  std::string events_path = plan_.run_dir + "/events.jsonl";
  events_file_.reset(OpenPrivateFile(events_path, O_WRONLY | O_APPEND, plan_.Files(), RunDirUse(), &err));
  if (!events_file_) Warn("cannot write events.jsonl: " + err);
  // A resumed run's events follow the earlier launches' ones: this line says where.
  if (plan_.resumed)
    WriteEvent({{"event", "resume"}, {"attempt_base", plan_.attempt_base}, {"t", 0.0},
                {"reason", "resumed by `dflash-launch run --resume`: this launch's attempt k writes attempt_" +
                               std::to_string(plan_.attempt_base) + "+k"}});

  // Before the first child: the cgroup it will be born into, and the guardian
  // that kills the run if we are SIGKILLed (docs/design.md, "Nothing outlives the run").
  run_token_ = NewRunToken();
  RunGuard::Options go;
  go.token = run_token_;
  go.bin_dir = plan_.bin_dir;
  go.log_path = plan_.run_dir + "/guardian.log";
  go.log_mode = plan_.Files();
  go.mode = options_.cgroup;
  go.env = options_.base_env;
  std::vector<std::string> notes;
  if (!guard_.Start(go, &err, &notes)) {
    start_error_ = err;
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
  core_.Start();
  Drain();
  PublishStatus(true);

  epoll_event events[64];
  while (!core_.Done()) {
    SteadyTime wait_began = std::chrono::steady_clock::now();
    SteadyTime asked = SteadyTime::max();
    int n = ::epoll_wait(epoll_.get(), events, 64, NextTimeoutMs(wait_began, &asked));
    int wait_errno = errno;
    // A SIGSTOP/SIGCONT of the supervisor ends epoll_wait with EINTR, whatever
    // it was waiting for: time it did not see is told first, never judged.
    core_.OnLoopTurn(wait_began, asked, std::chrono::steady_clock::now());
    Drain();
    if (n < 0 && wait_errno != EINTR) {
      core_.Abort(ErrnoMessage("epoll_wait", wait_errno));
      Drain();
      break;
    }
    Dispatch(events, std::max(n, 0));
    probes_->Expire(std::chrono::steady_clock::now());
    DeliverProbes();
    // Before a deadline is judged, what is already queued is taken: the pings
    // and READY=1 a payload sent while we were not looking count.
    if (core_.NextDeadline() <= std::chrono::steady_clock::now()) TakeQueued(events);
    core_.OnTick();
    Drain();
    // Leftovers of processes that ended, once per turn of the loop (not once
    // per exit); while the whole run stops, once at the end.
    if (sweep_pending_ && !core_.stopping()) SweepOrphans(false);
    PublishStatus(false);
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
  PublishStatus(true);
  return core_.ExitCode();
}

void Supervisor::Impl::Dispatch(const epoll_event* events, int n) {
  for (int k = 0; k < n; ++k) {
    uint64_t kind = events[k].data.u64 >> 32, id = events[k].data.u64 & 0xffffffff;
    if (kind == kTagSignal) {
      signalfd_siginfo si;
      while (signals_.Read(&si)) {
        int sig = static_cast<int>(si.ssi_signo);
        if (sig == SIGCHLD) Reap();
        else core_.OnSignal(sig);
        Drain();
      }
    } else if (kind == kTagNotify) {
      OnNotify();
    } else if (kind == kTagExec) {
      OnExecStatus(id);
    } else if (kind == kTagStream) {
      int sid = static_cast<int>(id);
      // An earlier event of this batch (a child's exit) may have closed it.
      if (id >= stream_owner_.size() || stream_owner_[id] < 0) continue;
      size_t owner = static_cast<size_t>(stream_owner_[id]);
      if (!router_.OnReadable(sid)) CloseStream(sid);
      core_.OnOutput(owner);
    } else if (kind == kTagProbe) {
      probes_->OnReady(static_cast<uint32_t>(id));
      DeliverProbes();
    } else if (kind == kTagWatch) {
      if (id < watches_.size() && watches_[id]) {
        auto cb = watches_[id];  // it may remove itself
        cb();
      }
    }
    Drain();
  }
}

void Supervisor::Impl::DeliverProbes() {
  if (!probes_->HasDone()) return;
  Reap();
  for (const ProbeRunner::Result& r : probes_->TakeDone()) {
    core_.OnProbeResult(r.index, r.seq, r.answered, r.detail);
    Drain();  // a try that ended at once (a refusal) may be followed by the next
  }
}

void Supervisor::Impl::TakeQueued(epoll_event* events) {
  // Datagrams first (all of them: Receive reads until EAGAIN), then one look
  // at every fd without waiting. A pipe that keeps writing cannot hold the
  // verdict off: the look is bounded.
  OnNotify();
  Drain();
  for (int pass = 0; pass < 4; ++pass) {
    int n = ::epoll_wait(epoll_.get(), events, 64, 0);
    if (n <= 0) return;
    Dispatch(events, n);
  }
}

int Supervisor::Impl::NextTimeoutMs(SteadyTime now, SteadyTime* asked) const {
  SteadyTime next = core_.NextWake(now);
  // The live view is refreshed at least once a second while someone shows it.
  if (console_) next = std::min(next, last_status_ + kStatusPeriod);
  next = std::min(next, probes_->NextDeadline());
  *asked = next;
  if (next == SteadyTime::max()) return -1;
  if (next <= now) return 0;
  // Round up: waking a millisecond early would spin once more for nothing.
  return static_cast<int>(std::chrono::ceil<Millis>(next - now).count());
}

void Supervisor::Impl::Reap() {
  for (;;) {
    int status = 0;
    pid_t pid = ::waitpid(-1, &status, WNOHANG);
    if (pid <= 0) return;  // 0: none left that has exited; -1/ECHILD: no children at all
    // A worker's last words (how its payload ended) were queued before it
    // exited, so they are readable now: take them before judging its exit.
    OnNotify();
    int found = -1;
    for (size_t i = 0; i < core_.size(); ++i)
      if (core_.proc(i).pid == pid) found = static_cast<int>(i);
    if (found < 0) {
      if (pid == options_.keep_pid) {
        options_.keep_pid = -1;
        std::string how = "the private store (redis-server pid " + std::to_string(pid) + ") " +
                          DecodeWaitStatus(status).Describe();
        Warn(how);
        // Its port is free for anyone now: the run ends rather than reconnect to whatever binds it next.
        core_.StopForNode("node 0 (its private store)", how + ": the run's store is gone", exit_code::kNodeFailed);
        continue;
      }
      if (pid == guard_.guardian_pid()) {
        guard_.GuardianReaped();
        std::string how = "(pid " + std::to_string(pid) + ") " + DecodeWaitStatus(status).Describe();
        std::string gerr;
        if (core_.OnGuardianDied(how)) {
          if (guard_.Restart(&gerr)) Info("dflash-guardian restarted: pid " + std::to_string(guard_.guardian_pid()));
          else core_.StopUnguarded("dflash-guardian " + how + " and a new one cannot be started (" + gerr +
                                   "): stopping the run, which a SIGKILL of the launcher would leave behind");
        }
        Drain();
        continue;
      }
      if (log_) log_->debug("reaped orphan {} ({})", pid, DecodeWaitStatus(status).Describe());
      sweep_pending_ = true;  // its own children (if any) were re-parented to us
      continue;
    }
    size_t i = static_cast<size_t>(found);
    OnExecStatus(i);  // an exec that failed at once: its reason first
    // Nothing it wrote may be left in the pipes when we decide what it said.
    for (int sid : {os_[i].out_stream, os_[i].err_stream})
      if (sid >= 0 && !router_.Drain(sid)) CloseStream(sid);
    const CoreProc& p = core_.proc(i);
    std::string msg;
    nlohmann::json ef = ReadErrorFile(plan_.AttemptPath(*p.plan, p.attempt, "error.json"), &msg);
    core_.OnExit(i, DecodeWaitStatus(status), ef.is_null() ? std::string() : msg);
    Drain();
  }
}

void Supervisor::Impl::OnNotify() {
  std::vector<NotifyMessage> msgs;
  std::string err;
  if (!notify_.Receive(&msgs, &err)) Warn("notify socket: " + err);
  for (const NotifyMessage& m : msgs) {
    int i = core_.FindSender(m.pid, m.pgid);
    if (i < 0) continue;  // a late message from a process already gone
    NotifyFields f = DecodeNotify(m.fields);
    if (f.main_pid) CheckMainPid(static_cast<size_t>(i), &f);
    core_.OnReport(static_cast<size_t>(i), f);
  }
}

void Supervisor::Impl::CheckMainPid(size_t i, NotifyFields* f) {
  const CoreProc& p = core_.proc(i);
  std::string leaf = guard_.cgroup() ? guard_.cgroup_dir() + "/" + LeafName(i, p.attempt) : std::string();
  std::string why;
  VerifiedPid v;
  if (p.alive() && CheckPidClaim(*f->main_pid, p.pid, leaf, &v, &why)) {
    os_[i].payload = v;
    return;
  }
  if (why.empty()) why = "MAINPID=" + std::to_string(*f->main_pid) + " came after its process ended";
  f->main_pid.reset();  // the claim never reaches the core: nothing is shown, measured or killed by it
  Warn(p.plan->name + ": " + why + ": ignored");
}

void Supervisor::Impl::Ended(size_t i) {
  const CoreProc& p = core_.proc(i);
  // Its cgroup leaf holds its whole tree, setsid and double-fork included.
  core_.NoteMemoryPeak(i, guard_.Ended(i, p.attempt));
  // Without cgroups, at once: its process groups (its session's first group,
  // the payload's group under a worker). The rest (own groups, setsid) are
  // orphans re-parented to us: the next sweep finds them by their marker.
  pid_t last_pid = p.last() ? p.last()->pid : -1;
  int groups = 0;
  if (last_pid > 0 && ::kill(-last_pid, SIGKILL) == 0) ++groups;
  if (SignalVerified(os_[i].payload, SIGKILL)) ++groups;
  if (groups > 0 && log_)
    log_->info("killing the leftovers of {} (pid {}, ended) in its process group(s)", p.plan->name, last_pid);
  sweep_pending_ = true;
}

void Supervisor::Impl::KillAll() {
  for (size_t i = 0; i < core_.size(); ++i) {
    const CoreProc& p = core_.proc(i);
    if (!p.alive()) continue;
    ::kill(-p.pid, SIGKILL);
    SignalVerified(os_[i].payload, SIGKILL);
  }
  guard_.KillAll();
  SweepOrphans(true);
}

std::vector<pid_t> Supervisor::Impl::SweepOrphansImpl(bool all) {
  sweep_pending_ = false;
  std::vector<pid_t> killed;
  std::vector<pid_t> children = OwnChildren();
  if (children.empty()) return killed;
  std::vector<RunProcess> processes;
  for (size_t i = 0; i < core_.size(); ++i) {
    const CoreProc& p = core_.proc(i);
    processes.push_back({p.plan->name, p.pid, p.attempt, p.alive()});
  }
  pid_t own_group = ::getpgrp();
  for (pid_t pid : children) {
    if (pid == guard_.guardian_pid() || pid == options_.keep_pid) continue;
    ProcStat st;
    if (!ReadProcStat(pid, &st) || st.state == 'Z') continue;  // the reaper collects it
    Orphan o{pid, st.sid, st.pgid, EnvironValue(pid, kRunTokenVar), EnvironValue(pid, env::kProcess),
             EnvironValue(pid, env::kAttempt)};
    OrphanVerdict v = JudgeOrphan(o, processes, run_token_, own_group, all);
    if (!v.kill) continue;
    std::string comm, e;
    ReadFile("/proc/" + std::to_string(pid) + "/comm", &comm, &e);
    if (!comm.empty() && comm.back() == '\n') comm.pop_back();
    if (log_) log_->info("killing leftover {} ({}) of {}", pid, comm, v.whose);
    if (v.kill_group) ::kill(-st.pgid, SIGKILL);
    ::kill(pid, SIGKILL);
    killed.push_back(pid);
  }
  return killed;
}

void Supervisor::Impl::FinalSweep() {
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

void Supervisor::Impl::CheckReuseHitTheCache(size_t i) {
  const CoreProc& p = core_.proc(i);
  nlohmann::json m = ReadMetricsFile(plan_.AttemptPath(*p.plan, p.attempt, "metrics.json"));
  auto sha256_now = [](const std::string& path) {
    std::string text, err;
    return ReadFile(path, &text, &err) ? Sha256Hex(text) : std::string();
  };
  std::string warning = ReuseMissWarning(p.plan->name, p.gate().key.value_or(""), MetricsCounter(m, "fxgraph_cache_miss"),
                                         plan_.roles[p.plan->role_index].key_files, sha256_now);
  if (!warning.empty()) core_.AddWarning(warning);
}

void Supervisor::Impl::TellSystemd(const std::string& message) {
  if (options_.systemd_notify_socket.empty()) return;
  std::string err;
  if (!NotifySendTo(options_.systemd_notify_socket, message, &err) && log_) log_->warn("systemd notify: {}", err);
}

// --- the public face ------------------------------------------------------------

std::vector<int> Supervisor::HandledSignals(const Plan& plan) {
  std::vector<int> s = {SIGCHLD, SIGINT, SIGTERM, SIGHUP};
  for (int f : plan.config.run.forward_signals)
    if (std::find(s.begin(), s.end(), f) == s.end()) s.push_back(f);
  return s;
}

Supervisor::Supervisor(const Plan& plan, SupervisorOptions options, Console* console,
                       std::shared_ptr<spdlog::logger> log)
    : impl_(std::make_unique<Impl>(plan, std::move(options), console, std::move(log))) {}

Supervisor::~Supervisor() = default;

int Supervisor::Run() { return impl_->Run(); }

RunSummary Supervisor::Summary() const {
  double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - impl_->t0_).count();
  return BuildRunSummary(impl_->core_, wall, impl_->start_error_);
}

ControlHandler& Supervisor::control() { return *impl_; }

void Supervisor::BeginRound(int round, const std::string& why) {
  impl_->core_.BeginRound(round, why);
  impl_->Drain();
}
void Supervisor::StartRound(int round) {
  impl_->core_.StartRound(round);
  impl_->Drain();
}
void Supervisor::StopForNode(const std::string& culprit, const std::string& reason, int exit_code,
                             nlohmann::json record) {
  impl_->core_.StopForNode(culprit, reason, exit_code, std::move(record));
  impl_->Drain();
}

bool Supervisor::AddWatch(int fd, std::function<void()> on_readable, std::string* err) {
  if (!impl_->epoll_) {
    *err = ErrnoMessage("epoll_create1", errno);
    return false;
  }
  size_t id = impl_->watches_.size();
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.u64 = Tag(kTagWatch, id);
  if (::epoll_ctl(impl_->epoll_.get(), EPOLL_CTL_ADD, fd, &ev) != 0) {
    *err = ErrnoMessage("epoll_ctl", errno);
    return false;
  }
  impl_->watches_.push_back(std::move(on_readable));
  impl_->watch_fds_.push_back(fd);
  return true;
}

void Supervisor::RemoveWatch(int fd) {
  for (size_t id = 0; id < impl_->watch_fds_.size(); ++id) {
    if (impl_->watch_fds_[id] != fd) continue;
    ::epoll_ctl(impl_->epoll_.get(), EPOLL_CTL_DEL, fd, nullptr);
    impl_->watch_fds_[id] = -1;
    impl_->watches_[id] = nullptr;
  }
}

}  // namespace dflash
