// Signals taken as data: blocked in the calling thread and read from a
// signalfd inside the event loop's wait, never run as asynchronous handlers.
#pragma once

#include <signal.h>
#include <sys/signalfd.h>

#include <initializer_list>
#include <string>
#include <vector>

#include "common/fd.h"

namespace dflash {

/// Blocks a set of signals for its lifetime and makes them readable on an fd
/// (SFD_CLOEXEC | SFD_NONBLOCK) for epoll/ppoll.
/// REQUIRES: every other thread of the process blocks these signals too (block
/// them in main() before starting threads), or a process-directed signal may
/// be delivered to a thread that does not, with its default action.
class SignalFd {
 public:
  SignalFd() = default;
  SignalFd(const SignalFd&) = delete;
  SignalFd& operator=(const SignalFd&) = delete;
  /// Drains what is still pending, then restores the thread's earlier mask
  /// (so a signal that arrived late does not kill the caller on the way out).
  ~SignalFd();

  bool Open(std::initializer_list<int> signals, std::string* err);
  bool Open(const std::vector<int>& signals, std::string* err);
  int fd() const { return fd_.get(); }
  /// One pending signal into `out`; false when none is pending.
  bool Read(signalfd_siginfo* out);

 private:
  UniqueFd fd_;
  sigset_t old_mask_{};
  bool blocked_ = false;
};

/// Blocks `signals` in the calling thread (and the threads it starts later).
void BlockSignals(std::initializer_list<int> signals);
void BlockSignals(const std::vector<int>& signals);

}  // namespace dflash
