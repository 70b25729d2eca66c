// Level (b), the authority: an open-file-description lock on <dir>/.dflash/gate.lock.
#pragma once

#include <sys/types.h>

#include <string>

namespace dflash {

enum class LockAttempt { kAcquired, kBusy, kFailed };

/// Tries once to take a whole-file write lock on `fd` with F_OFD_SETLK.
/// Never blocks: waits are bounded by the caller's polling (see gate.cc).
LockAttempt OfdTryLock(int fd, std::string* err);

/// Drops the lock taken through `fd` (a no-op if none).
void OfdUnlock(int fd);

/// Who, if anyone, holds a lock that would conflict with ours. `pid` is the
/// holder's pid for a classic POSIX lock (Python's fcntl.lockf) and -1 for an
/// OFD lock (the kernel does not say whose description it is).
struct LockProbe {
  bool held = false;
  pid_t pid = 0;
};
bool OfdProbe(int fd, LockProbe* out, std::string* err);

}  // namespace dflash
