#include "cachelock/ofd_lock.h"

#include <fcntl.h>

#include <cerrno>

#include "common/fd.h"

namespace dflash {

// The quirks of this lock, which the whole gate rests on:
//
// - OFD locks (F_OFD_SETLK, Linux >= 3.15) belong to the open file description,
//   not to the process. Two open()s of gate.lock in one process -- two threads,
//   or two CompileGate objects -- conflict like two processes do. Classic POSIX
//   locks (F_SETLK, boost::interprocess::file_lock) do not: there a second
//   thread "takes" the lock its process already holds, and closing *any* fd of
//   the file in the process drops it.
// - dup() and fork() share the description, and with it the lock: a forked
//   child holding a copy keeps the lock alive after its parent dies. Hence
//   O_CLOEXEC on every open and fork_guard.h for fork-without-exec.
// - The kernel drops the lock when the last fd of the description is closed,
//   which includes the holder's death by SIGKILL: this is what makes the gate
//   crash-safe. It does not drop it for a stopped (SIGSTOP) holder, which is
//   why waits are bounded and name the holder.
// - OFD and classic locks on one file conflict with each other, so Python's
//   `fcntl.lockf(f, LOCK_EX)` (a classic whole-file lock) excludes us and we
//   exclude it. F_OFD_GETLK reports an OFD holder's pid as -1.
// - There is no timed F_OFD_SETLKW. We never block in the kernel: callers poll
//   F_OFD_SETLK with back-off. Local waiters queue on the named mutex (level a)
//   first, so at most one process per host polls here.
// - On NFS the client maps the lock to NLM/NFSv4 byte-range locks (server
//   round trips); a client that loses its lease loses the lock.
// - l_len = 0 locks to "end of file, however it grows": the whole file, as
//   lockf(fd, LOCK_EX) does. l_pid must be 0 for OFD commands.

namespace {

struct flock WholeFile(short type) {
  struct flock fl {};
  fl.l_type = type;
  fl.l_whence = SEEK_SET;
  fl.l_start = 0;
  fl.l_len = 0;
  fl.l_pid = 0;
  return fl;
}

}  // namespace

LockAttempt OfdTryLock(int fd, std::string* err) {
  struct flock fl = WholeFile(F_WRLCK);
  if (::fcntl(fd, F_OFD_SETLK, &fl) == 0) return LockAttempt::kAcquired;
  if (errno == EAGAIN || errno == EACCES || errno == EINTR) return LockAttempt::kBusy;
  if (err) *err = ErrnoMessage("fcntl(F_OFD_SETLK)", errno);
  return LockAttempt::kFailed;
}

void OfdUnlock(int fd) {
  struct flock fl = WholeFile(F_UNLCK);
  ::fcntl(fd, F_OFD_SETLK, &fl);
}

bool OfdProbe(int fd, LockProbe* out, std::string* err) {
  struct flock fl = WholeFile(F_WRLCK);
  if (::fcntl(fd, F_OFD_GETLK, &fl) != 0) {
    if (err) *err = ErrnoMessage("fcntl(F_OFD_GETLK)", errno);
    return false;
  }
  out->held = fl.l_type != F_UNLCK;
  out->pid = out->held ? fl.l_pid : 0;
  return true;
}

}  // namespace dflash
