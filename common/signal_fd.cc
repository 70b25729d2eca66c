#include "common/signal_fd.h"

#include <unistd.h>

#include <cerrno>

namespace dflash {

void BlockSignals(std::initializer_list<int> signals) { BlockSignals(std::vector<int>(signals)); }

void BlockSignals(const std::vector<int>& signals) {
  sigset_t set;
  sigemptyset(&set);
  for (int s : signals) sigaddset(&set, s);
  ::pthread_sigmask(SIG_BLOCK, &set, nullptr);
}

bool SignalFd::Open(std::initializer_list<int> signals, std::string* err) {
  return Open(std::vector<int>(signals), err);
}

bool SignalFd::Open(const std::vector<int>& signals, std::string* err) {
  sigset_t set;
  sigemptyset(&set);
  for (int s : signals) sigaddset(&set, s);
  if (!blocked_) {
    if (int e = ::pthread_sigmask(SIG_BLOCK, &set, &old_mask_); e != 0) {
      if (err) *err = ErrnoMessage("pthread_sigmask", e);
      return false;
    }
    blocked_ = true;
  }
  fd_.reset(::signalfd(-1, &set, SFD_CLOEXEC | SFD_NONBLOCK));
  if (!fd_) {
    if (err) *err = ErrnoMessage("signalfd", errno);
    return false;
  }
  return true;
}

bool SignalFd::Read(signalfd_siginfo* out) {
  for (;;) {
    ssize_t n = ::read(fd_.get(), out, sizeof *out);
    if (n == static_cast<ssize_t>(sizeof *out)) return true;
    if (n < 0 && errno == EINTR) continue;
    return false;
  }
}

SignalFd::~SignalFd() {
  if (fd_) {
    signalfd_siginfo si;
    while (Read(&si)) {
    }
  }
  if (blocked_) ::pthread_sigmask(SIG_SETMASK, &old_mask_, nullptr);
}

}  // namespace dflash
