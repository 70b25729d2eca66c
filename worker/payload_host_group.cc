// The payload host's hold on the payload's process group: signals forwarded
// to it (or SIGKILL when our own parent died), the payload and its orphans
// reaped, the group stopped (stop signal, grace, SIGKILL) and waited out.
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>

#include "common/signal_names.h"
#include "worker/payload_host_internal.h"

namespace dflash {

void PayloadHost::OnSignals() {
  signalfd_siginfo si;
  bool chld = false;
  while (signals_.Read(&si)) {
    int sig = static_cast<int>(si.ssi_signo);
    if (sig == SIGCHLD) chld = true;
    else if (sig != SIGPIPE) Forward(sig);
  }
  if (chld) Reap();
}

void PayloadHost::Forward(int sig) {
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

void PayloadHost::Reap() {
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

void PayloadHost::PayloadExited(int status) {
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

void PayloadHost::StartStop() {
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

bool PayloadHost::GroupAlive() const { return ::kill(-pid_, 0) == 0 || errno == EPERM; }

void PayloadHost::CheckDone() {
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

}  // namespace dflash
