#include "worker/payload_host.h"

#include <fcntl.h>
#include <sys/epoll.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/timerfd.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <chrono>
#include <functional>
#include <memory>

#include "common/exit_codes.h"
#include "common/fd.h"
#include "common/notify.h"
#include "common/signal_fd.h"
#include "common/signal_names.h"
#include "contract/pause.h"
#include "contract/readiness.h"
#include "worker/output_relay.h"
#include "worker/protocol.h"
#include "contract/process_env.h"

namespace dflash {
namespace {

using Clock = std::chrono::steady_clock;

/// How often a `file` readiness path is checked. A timer rather than inotify:
/// the path may be on NFS (inotify sees only local changes) and its directory
/// may not exist yet.
constexpr auto kFileTick = std::chrono::milliseconds(100);
/// While leftovers of the payload's group run after the payload exited: how
/// often to look whether the group is empty (members that are not our
/// children send us no SIGCHLD), and how long to wait after SIGKILL.
constexpr auto kGroupPollTick = std::chrono::milliseconds(100);
constexpr auto kGiveUpAfterKill = std::chrono::seconds(5);
/// Bytes read from one pipe per wake-up, so a chatty payload cannot starve
/// signal handling.
constexpr size_t kReadBudget = 1 << 20;

enum Tag : uint32_t { kTagSignal, kTagTimer, kTagNotify, kTagStdout, kTagStderr };

class Host {
 public:
  explicit Host(const PayloadHostOptions& o)
      : o_(o), name_(o.name.empty() ? (o.argv.empty() ? "payload" : o.argv[0]) : o.name) {
    ::prctl(PR_GET_CHILD_SUBREAPER, &was_subreaper_);
  }
  ~Host() {
    if (!was_subreaper_) ::prctl(PR_SET_CHILD_SUBREAPER, 0);
  }

  PayloadResult Run();

 private:
  bool Setup(std::vector<std::string>* env, std::string* err);
  void Loop();
  std::string Label() const { return name_ + " (pid " + std::to_string(pid_) + ")"; }

  /// Feeds one piece of evidence to readiness_; runs Ready() if it made the
  /// payload ready. A payload that already died (unreaped) is reaped first,
  /// so its exit status judges what it left.
  void Evidence(const std::function<bool()>& feed);
  /// Once, when readiness_ said ready: on_ready, then stop_when_ready.
  void Ready();
  bool PayloadIsZombie() const;
  void OnNotify();
  /// Reads pipe `i`; `budget` bytes at most (SIZE_MAX: until EAGAIN or EOF).
  void OnPipe(int i, size_t budget);
  void OnTimer();
  void OnSignals();
  void Forward(int sig);
  void Reap();
  void PayloadExited(int status);
  void CheckFile();
  void StartStop();
  bool GroupAlive() const;
  void CheckDone();
  void ArmTimer();
  /// After each wait: a wake-up much later than the timer asked for is time
  /// this host did not see (it was stopped with the whole run): the readiness
  /// timeout and the stop grace get it back (contract/pause.h).
  void CheckPause(Clock::time_point now);

  const PayloadHostOptions& o_;
  std::string name_;
  pid_t pid_ = -1;
  pid_t ppid0_ = 0;

  SignalFd signals_;
  UniqueFd epoll_, timer_;
  NotifyListener listener_;
  std::optional<Readiness> readiness_;  // contract/readiness.h: the one judge of readiness
  std::array<UniqueFd, 2> pipes_;  // read ends of the payload's stdout/stderr (log mode)
  std::array<std::unique_ptr<OutputRelay>, 2> relays_;

  int was_subreaper_ = 0;
  bool timed_out_ = false;
  bool parent_died_ = false;
  bool exited_ = false;
  bool stopping_ = false;
  bool kill_sent_ = false;
  bool done_ = false;
  bool stopped_when_ready_ = false;
  ExitStatus status_;
  std::string message_;

  std::optional<Clock::time_point> file_tick_, kill_deadline_, group_poll_,
      give_up_;
  std::optional<Clock::time_point> armed_for_;  // what ArmTimer asked for while a deadline runs
};

bool Host::Setup(std::vector<std::string>* env, std::string* err) {
  if (!signals_.Open({SIGCHLD, SIGPIPE, SIGTERM, SIGINT, SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2}, err))
    return false;
  // Orphans of the payload become our children, so we can reap them and
  // nothing of the payload's tree escapes to init while we run. Restored on
  // return: a process that no longer reaps must not collect orphans.
  if (::prctl(PR_SET_CHILD_SUBREAPER, 1) != 0) {
    *err = ErrnoMessage("prctl(PR_SET_CHILD_SUBREAPER)", errno);
    return false;
  }
  ppid0_ = ::getppid();
  timer_.reset(::timerfd_create(CLOCK_MONOTONIC, TFD_CLOEXEC | TFD_NONBLOCK));
  epoll_.reset(::epoll_create1(EPOLL_CLOEXEC));
  if (!timer_ || !epoll_) {
    *err = ErrnoMessage(!timer_ ? "timerfd_create" : "epoll_create1", errno);
    return false;
  }
  auto watch = [&](int fd, uint32_t tag) {
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.u32 = tag;
    if (::epoll_ctl(epoll_.get(), EPOLL_CTL_ADD, fd, &ev) == 0) return true;
    *err = ErrnoMessage("epoll_ctl", errno);
    return false;
  };
  if (!watch(signals_.fd(), kTagSignal) || !watch(timer_.get(), kTagTimer)) return false;

  *env = o_.env.empty() ? CurrentEnvironment() : o_.env;
  for (const auto& [k, v] : o_.extra_env) SetEnvVar(env, k, v);
  UnsetEnvVar(env, env::kNotifySocket);
  if (o_.ready.mode == ReadyMode::kNotify || o_.on_watchdog || o_.on_precompile) {
    if (!listener_.Open(err) || !watch(listener_.fd(), kTagNotify)) return false;
    SetEnvVar(env, env::kNotifySocket, listener_.address());
  }
  readiness_.emplace(o_.ready);
  if (!readiness_->Init(err)) return false;
  if (o_.ready.mode == ReadyMode::kLog) {
    for (int i = 0; i < 2; ++i) {
      auto on_line = [this, i](std::string_view line) {
        if (readiness_->WantsLines()) Evidence([&] { return readiness_->OnLine(i, line); });
      };
      relays_[i] = std::make_unique<OutputRelay>(i == 0 ? o_.stdout_fd : o_.stderr_fd, on_line);
    }
  }
  return true;
}

PayloadResult Host::Run() {
  PayloadResult r;
  // An inherited SIG_IGN (or SA_NOCLDWAIT) on SIGCHLD would make the kernel
  // reap the payload behind our back: no exit status to pass up.
  struct sigaction dfl{}, old_chld{};
  dfl.sa_handler = SIG_DFL;
  ::sigaction(SIGCHLD, &dfl, &old_chld);
  struct RestoreChld {
    struct sigaction* old;
    ~RestoreChld() { ::sigaction(SIGCHLD, old, nullptr); }
  } restore{&old_chld};

  std::vector<std::string> env;
  std::string err;
  if (!Setup(&env, &err)) {
    r.exit_code = exit_code::kFailure;
    r.message = name_ + ": " + err;
    return r;
  }

  // Log mode: the payload writes into pipes we read; otherwise it writes
  // straight into our stdout/stderr.
  SpawnOptions so;
  so.argv = o_.argv;
  so.env = std::move(env);
  so.cwd = o_.cwd;
  so.stdin_fd = kDevNullFd;
  so.stdout_fd = o_.stdout_fd;
  so.stderr_fd = o_.stderr_fd;
  so.group = SpawnOptions::Group::kNewProcessGroup;
  so.death_signal = SIGKILL;
  std::array<UniqueFd, 2> write_ends;
  if (relays_[0]) {
    for (int i = 0; i < 2; ++i) {
      int p[2];
      if (::pipe2(p, O_CLOEXEC) != 0) {
        r.exit_code = exit_code::kFailure;
        r.message = name_ + ": " + ErrnoMessage("pipe2", errno);
        return r;
      }
      pipes_[i].reset(p[0]);
      write_ends[i].reset(p[1]);
      ::fcntl(p[0], F_SETFL, O_NONBLOCK);
      epoll_event ev{};
      ev.events = EPOLLIN;
      ev.data.u32 = i == 0 ? kTagStdout : kTagStderr;
      ::epoll_ctl(epoll_.get(), EPOLL_CTL_ADD, p[0], &ev);
    }
    so.stdout_fd = write_ends[0].get();
    so.stderr_fd = write_ends[1].get();
  }

  Child child;
  bool started = Spawn(so, &child, &err);
  for (auto& w : write_ends) w.reset();  // EOF must mean "the payload's side closed"
  r.pid = pid_ = child.pid;
  if (!started) {
    // The failed child (if one was forked) exited with child.exit_code; we
    // are its reaper.
    if (child.pid > 0) {
      ExitStatus st;
      std::string werr;
      WaitForChild(child.pid, &st, &werr);
    }
    r.exit_code = child.exit_code != 0 ? child.exit_code : exit_code::kFailure;
    r.message = o_.name.empty() ? err : name_ + ": " + err;
    return r;
  }

  if (o_.on_spawned) o_.on_spawned(pid_);
  if (readiness_->OnExec(Clock::now())) Ready();
  if (readiness_->WantsFileCheck()) CheckFile();

  Loop();

  // The group is gone. Take what is still buffered; a writer that escaped the
  // group (setsid) may hold the pipe open, so never wait for its EOF.
  for (int i = 0; i < 2; ++i) {
    if (!pipes_[i]) continue;  // already finished at EOF
    OnPipe(i, SIZE_MAX);
    if (pipes_[i]) relays_[i]->Finish();  // no EOF: flush the partial last line
  }

  r.ready = readiness_->verdict() == Readiness::Verdict::kReady;
  r.timed_out = timed_out_;
  r.parent_died = parent_died_;
  r.status = status_;
  r.exit_code = timed_out_ ? exit_code::kTimeout : status_.ExitCode();
  // Stopped by us because it was ready (a warm-up): that is its success.
  if (stopped_when_ready_ && !parent_died_) r.exit_code = exit_code::kOk;
  r.stopped_when_ready = stopped_when_ready_;
  r.message = message_;
  return r;
}

void Host::Loop() {
  while (!done_) {
    ArmTimer();
    epoll_event evs[8];
    int n = ::epoll_wait(epoll_.get(), evs, 8, -1);
    int wait_errno = errno;
    CheckPause(Clock::now());  // a SIGSTOP/SIGCONT ends the wait with EINTR
    errno = wait_errno;
    if (n < 0) {
      if (errno == EINTR) continue;
      // Cannot supervise any more: take the payload down with us rather
      // than leave it unsupervised, and reap it.
      message_ = Label() + ": " + ErrnoMessage("epoll_wait", errno) + "; killed the payload";
      ::kill(-pid_, SIGKILL);
      int st = 0;
      while (::waitpid(pid_, &st, 0) < 0 && errno == EINTR) {
      }
      status_ = DecodeWaitStatus(st);
      exited_ = true;
      return;
    }
    bool sig = false, timer = false, notify = false, out[2] = {false, false};
    for (int k = 0; k < n; ++k) {
      switch (evs[k].data.u32) {
        case kTagSignal: sig = true; break;
        case kTagTimer: timer = true; break;
        case kTagNotify: notify = true; break;
        case kTagStdout: out[0] = true; break;
        case kTagStderr: out[1] = true; break;
      }
    }
    // Readiness evidence first: a READY=1 or a matching line that arrived
    // together with the exit still counts.
    if (notify) OnNotify();
    for (int i = 0; i < 2; ++i)
      if (out[i]) OnPipe(i, kReadBudget);
    if (timer) OnTimer();
    if (sig) OnSignals();
    CheckDone();
  }
}

void Host::Evidence(const std::function<bool()>& feed) {
  if (!readiness_->waiting()) return;
  // Evidence counts only from a payload that is alive or ended well (the
  // Readiness rule). A dead but unreaped payload is judged by its exit
  // status, which reaping brings: PayloadExited drains the evidence again.
  if (!exited_ && PayloadIsZombie()) {
    Reap();
    return;
  }
  if (feed()) Ready();
}

void Host::Ready() {
  file_tick_.reset();
  for (auto& r : relays_)
    if (r) r->StopLines();
  if (o_.on_ready) o_.on_ready();
  if (o_.stop_when_ready && !exited_) {
    stopped_when_ready_ = true;
    StartStop();
  }
}

bool Host::PayloadIsZombie() const {
  siginfo_t si{};
  return ::waitid(P_PID, static_cast<id_t>(pid_), &si, WEXITED | WNOHANG | WNOWAIT) == 0 && si.si_pid == pid_;
}

void Host::OnNotify() {
  std::vector<NotifyMessage> msgs;
  std::string err;
  listener_.Receive(&msgs, &err);  // an error here only loses diagnostics
  for (const auto& m : msgs) {
    // The payload itself, or anything in its process group (systemd-notify
    // run by a payload shell). Others on this host may know the address.
    if (m.pid != pid_ && !(m.pgid > 0 && m.pgid == pid_)) continue;
    NotifyFields f = DecodeNotify(m.fields);
    if (f.status && o_.on_status) o_.on_status(*f.status);
    if (f.watchdog && o_.on_watchdog) o_.on_watchdog();
    if ((f.gate_precompiled || f.gate_precompile || f.gate_dynamo_hits) && o_.on_precompile) {
      NotifyFields p;  // only these: the payload cannot speak for the worker's gate
      p.gate_precompiled = f.gate_precompiled;
      p.gate_precompile = f.gate_precompile;
      p.gate_dynamo_hits = f.gate_dynamo_hits;
      o_.on_precompile(p);
    }
    if (f.ready) Evidence([&] { return readiness_->OnNotifyReady(); });
  }
}

void Host::OnPipe(int i, size_t budget) {
  char buf[65536];
  size_t total = 0;
  while (pipes_[i] && total < budget) {
    ssize_t n = ::read(pipes_[i].get(), buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return;  // EAGAIN: drained for now
    if (n == 0) {
      relays_[i]->Finish();
      ::epoll_ctl(epoll_.get(), EPOLL_CTL_DEL, pipes_[i].get(), nullptr);
      pipes_[i].reset();
      return;
    }
    total += static_cast<size_t>(n);
    relays_[i]->Feed(std::string_view(buf, static_cast<size_t>(n)));
  }
}

void Host::CheckFile() {
  std::string path = o_.ready.arg;
  if (!path.empty() && path[0] != '/' && !o_.cwd.empty()) path = o_.cwd + "/" + path;
  struct stat st;
  if (::stat(path.c_str(), &st) == 0) {
    Evidence([&] { return readiness_->OnFileExists(); });
  } else if (readiness_->WantsFileCheck()) {
    file_tick_ = Clock::now() + kFileTick;
  }
}

void Host::OnTimer() {
  uint64_t expirations;
  while (::read(timer_.get(), &expirations, sizeof expirations) < 0 && errno == EINTR) {
  }
  auto now = Clock::now();
  if (file_tick_ && now >= *file_tick_) {
    file_tick_.reset();
    CheckFile();
  }
  if (readiness_->OnClock(now)) {
    std::string msg = Label() + " " + readiness_->TimeoutText();
    TimeoutAction action = o_.on_ready_timeout ? o_.on_ready_timeout(msg) : TimeoutAction::kStop;
    file_tick_.reset();
    if (action == TimeoutAction::kStop) {
      timed_out_ = true;
      message_ = msg;
      StartStop();
    }
  }
  if (kill_deadline_ && now >= *kill_deadline_) {
    kill_deadline_.reset();
    ::kill(-pid_, SIGKILL);
    kill_sent_ = true;
    give_up_ = now + kGiveUpAfterKill;
  }
  if (group_poll_ && now >= *group_poll_) group_poll_.reset();  // CheckDone looks again
}

void Host::OnSignals() {
  signalfd_siginfo si;
  bool chld = false;
  while (signals_.Read(&si)) {
    int sig = static_cast<int>(si.ssi_signo);
    if (sig == SIGCHLD) chld = true;
    else if (sig != SIGPIPE) Forward(sig);
  }
  if (chld) Reap();
}

void Host::Forward(int sig) {
  if (::getppid() != ppid0_) {
    // Reparented: our parent is gone and this is the PDEATHSIG it set for
    // us. Nobody is left to supervise the payload; take it down now.
    if (!parent_died_) {
      parent_died_ = true;
      message_ = Label() + ": the host's parent died (" + SignalName(sig) + "); killed the payload";
    }
    ::kill(-pid_, SIGKILL);
    kill_sent_ = stopping_ = true;
    kill_deadline_.reset();
    give_up_ = Clock::now() + kGiveUpAfterKill;
    return;
  }
  ::kill(-pid_, sig);  // ESRCH once the group is gone: nothing to do
}

void Host::Reap() {
  for (;;) {
    int st = 0;
    pid_t p = ::waitpid(-1, &st, WNOHANG);
    if (p > 0) {
      if (p == pid_) PayloadExited(st);
      continue;  // an orphan of the payload: reaped, nothing to report
    }
    if (p < 0 && errno == EINTR) continue;
    return;  // 0: others still run; ECHILD: none left
  }
}

void Host::PayloadExited(int status) {
  exited_ = true;
  status_ = DecodeWaitStatus(status);
  readiness_->OnExit(status_.exited && status_.code == 0);
  if (readiness_->waiting()) {
    // Evidence the payload left before it exited is already queued.
    if (o_.ready.mode == ReadyMode::kNotify || o_.on_watchdog) OnNotify();
    for (int i = 0; i < 2; ++i)
      if (pipes_[i]) OnPipe(i, SIZE_MAX);
    if (readiness_->WantsFileCheck()) CheckFile();
    if (readiness_->OnExitDrained()) Ready();
    if (readiness_->discounted_evidence() && message_.empty())
      message_ = Label() + ": readiness evidence from a payload that " + status_.Describe() + " does not count";
  }
  file_tick_.reset();
}

void Host::StartStop() {
  if (stopping_) return;
  stopping_ = true;
  ::kill(-pid_, o_.stop_signal);
  if (o_.stop_signal == SIGKILL) {
    kill_sent_ = true;
    give_up_ = Clock::now() + kGiveUpAfterKill;
  } else {
    kill_deadline_ = Clock::now() + o_.stop_grace;
  }
}

bool Host::GroupAlive() const { return ::kill(-pid_, 0) == 0 || errno == EPERM; }

void Host::CheckDone() {
  if (!exited_) return;
  if (!GroupAlive()) {
    done_ = true;
    return;
  }
  // The payload is gone but part of its group lives on: stop it too.
  StartStop();
  if (give_up_ && Clock::now() >= *give_up_) {
    done_ = true;  // unkillable (D state) or beyond our reach: do not hang
    return;
  }
  if (!group_poll_) group_poll_ = Clock::now() + kGroupPollTick;
}

void Host::CheckPause(Clock::time_point now) {
  if (!armed_for_ || now - *armed_for_ <= kPauseSlack) return;
  Clock::duration lost = now - *armed_for_;
  armed_for_.reset();
  readiness_->Postpone(lost);
  if (kill_deadline_) *kill_deadline_ += lost;
  if (give_up_) *give_up_ += lost;
}

void Host::ArmTimer() {
  std::optional<Clock::time_point> next;
  for (const auto& d : {readiness_->deadline(), file_tick_, kill_deadline_, group_poll_, give_up_})
    if (d && (!next || *d < *next)) next = d;
  // While a verdict by time is pending, look often enough to notice a pause.
  armed_for_.reset();
  if (readiness_->deadline() || kill_deadline_) {
    auto probe = Clock::now() + kPauseProbe;
    if (!next || probe < *next) next = probe;
    armed_for_ = next;
  }
  itimerspec its{};
  if (next) {
    // steady_clock is CLOCK_MONOTONIC on Linux; a time in the past fires at once.
    auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(next->time_since_epoch()).count();
    if (ns <= 0) ns = 1;
    its.it_value.tv_sec = static_cast<time_t>(ns / 1'000'000'000);
    its.it_value.tv_nsec = static_cast<long>(ns % 1'000'000'000);
  }
  ::timerfd_settime(timer_.get(), TFD_TIMER_ABSTIME, &its, nullptr);
}

}  // namespace

PayloadResult RunPayload(const PayloadHostOptions& opts) {
  Host host(opts);
  return host.Run();
}

}  // namespace dflash
