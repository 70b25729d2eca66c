#include "worker/payload_host.h"

#include <fcntl.h>
#include <sys/epoll.h>
#include <sys/prctl.h>
#include <sys/timerfd.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <chrono>

#include "common/exit_codes.h"
#include "contract/pause.h"
#include "contract/env_vars.h"
#include "worker/payload_host_internal.h"

namespace dflash {

PayloadHost::PayloadHost(const PayloadHostOptions& o)
    : o_(o), name_(o.name.empty() ? (o.argv.empty() ? "payload" : o.argv[0]) : o.name) {
  ::prctl(PR_GET_CHILD_SUBREAPER, &was_subreaper_);
}

PayloadHost::~PayloadHost() {
  if (!was_subreaper_) ::prctl(PR_SET_CHILD_SUBREAPER, 0);
}

bool PayloadHost::Setup(std::vector<std::string>* env, std::string* err) {
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
  if (o_.ready.mode == ReadyMode::kNotify || o_.on_watchdog) {
    if (!listener_.Open(err) || !watch(listener_.fd(), kTagNotify)) return false;
    SetEnvVar(env, env::kNotifySocket, listener_.address());
  }
  readiness_.emplace(o_.ready);
  if (!readiness_->Init(err)) return false;
  if (o_.ready.mode == ReadyMode::kLog) MakeRelays();
  return true;
}

PayloadResult PayloadHost::Run() {
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
  if (relays_[0] && !OpenPipes(&so, &write_ends, &err)) {
    r.exit_code = exit_code::kFailure;
    r.message = name_ + ": " + err;
    return r;
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

  DrainPipes();
  return Result();
}

PayloadResult PayloadHost::Result() const {
  PayloadResult r;
  r.pid = pid_;
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

void PayloadHost::Loop() {
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

void PayloadHost::OnTimer() {
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

void PayloadHost::CheckPause(Clock::time_point now) {
  if (!armed_for_ || now - *armed_for_ <= kPauseSlack) return;
  Clock::duration lost = now - *armed_for_;
  armed_for_.reset();
  readiness_->Postpone(lost);
  if (kill_deadline_) *kill_deadline_ += lost;
  if (give_up_) *give_up_ += lost;
}

void PayloadHost::ArmTimer() {
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

PayloadResult RunPayload(const PayloadHostOptions& opts) {
  PayloadHost host(opts);
  return host.Run();
}

}  // namespace dflash
