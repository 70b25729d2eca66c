// The child's side of Spawn(), between fork and exec (docs/design.md, "What
// `Spawn()` does"): async-signal-safe calls only, on a plan made in the parent.
#include "common/spawn_child.h"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "common/exit_codes.h"

#ifndef SYS_close_range
#define SYS_close_range 436
#endif

namespace dflash {

const char* StageName(int stage) {
  switch (stage) {
    case kStageCgroup: return "join cgroup";
    case kStageSignals: return "reset signals";
    case kStageGroup: return "setsid/setpgid";
    case kStageDeathSignal: return "prctl(PR_SET_PDEATHSIG)";
    case kStageStdio: return "dup2 stdio";
    case kStageChdir: return "chdir";
    case kStageCloseFds: return "close fds";
    default: return "execve";
  }
}

namespace {

[[noreturn]] void ChildFail(int error_fd, int stage, int errnum) {
  ErrorReport r{stage, errnum};
  // A short write is impossible for 8 bytes into an empty pipe; EINTR cannot
  // happen with every signal at default disposition that matters here.
  ssize_t n = ::write(error_fd, &r, sizeof r);
  (void)n;
  ::_exit(stage == kStageExec && (errnum == ENOENT || errnum == ENOTDIR)
              ? exit_code::kNotFound
              : exit_code::kNotExecutable);
}

bool IsKept(const ChildPlan& p, int fd) {
  for (size_t i = 0; i < p.nkeep; ++i)
    if (p.keep[i] == fd) return true;
  return false;
}

/// close_range(2) over [lo, hi]; false if the kernel lacks it.
bool CloseRange(unsigned lo, unsigned hi) {
  if (lo > hi) return true;
  return ::syscall(SYS_close_range, lo, hi, 0) == 0;
}

/// Fallback for kernels before 5.9: list /proc/self/fd with getdents64 into a
/// stack buffer (opendir would allocate). Closing entries already listed does
/// not disturb the listing: its offsets are fd numbers.
bool CloseViaProc(const ChildPlan& p) {
  int dir = ::open("/proc/self/fd", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dir < 0) return false;
  alignas(8) char buf[4096];
  for (;;) {
    long n = ::syscall(SYS_getdents64, dir, buf, sizeof buf);
    if (n < 0) {
      ::close(dir);
      return false;
    }
    if (n == 0) break;
    for (long off = 0; off < n;) {
      auto* d = reinterpret_cast<struct dirent64*>(buf + off);
      off += d->d_reclen;
      int fd = 0;
      const char* s = d->d_name;
      if (*s < '0' || *s > '9') continue;
      for (; *s >= '0' && *s <= '9'; ++s) fd = fd * 10 + (*s - '0');
      if (fd > 2 && fd != dir && !IsKept(p, fd)) ::close(fd);
    }
  }
  ::close(dir);
  return true;
}

void CloseOtherFds(const ChildPlan& p) {
  bool ok = true;
  unsigned lo = 3;
  for (size_t i = 0; i < p.nkeep && ok; ++i) {
    unsigned k = static_cast<unsigned>(p.keep[i]);
    if (k < lo) continue;
    if (k > lo) ok = CloseRange(lo, k - 1);
    lo = k + 1;
  }
  if (ok) ok = CloseRange(lo, ~0U);
  if (ok) return;
  if (CloseViaProc(p)) return;
  for (long fd = 3; fd < p.max_fd; ++fd)
    if (!IsKept(p, static_cast<int>(fd))) ::close(static_cast<int>(fd));
}

}  // namespace

/// Runs in the child between fork and exec: async-signal-safe calls only.
[[noreturn]] void RunChild(const ChildPlan& p) {
  // Into the run's cgroup before anything else can fork.
  if (p.cgroup_fd >= 0 && ::write(p.cgroup_fd, "0", 1) != 1) ChildFail(p.error_fd, kStageCgroup, errno);
  // Default dispositions first, then an empty mask: the other order could run
  // one of the parent's handlers (which might write to the parent's
  // self-pipe) inside the child. Ignored signals would otherwise survive exec.
  struct sigaction sa;
  std::memset(&sa, 0, sizeof sa);
  sa.sa_handler = SIG_DFL;
  sigemptyset(&sa.sa_mask);
  for (int s = 1; s < NSIG; ++s) {
    if (s == SIGKILL || s == SIGSTOP) continue;
    if (::sigaction(s, &sa, nullptr) == 0) continue;
    // glibc refuses its reserved signals (SIGCANCEL 32, SIGSETXID 33); the kernel
    // does not. If our own parent left them ignored, exec would pass that on.
    struct { void (*handler)(int); unsigned long flags; void (*restorer)(); unsigned long mask; } k{SIG_DFL, 0, nullptr, 0};
    ::syscall(SYS_rt_sigaction, s, &k, nullptr, sizeof k.mask);
  }
  sigset_t none;
  sigemptyset(&none);
  if (::sigprocmask(SIG_SETMASK, &none, nullptr) != 0) ChildFail(p.error_fd, kStageSignals, errno);

  if (p.group == SpawnOptions::Group::kNewSession) {
    if (::setsid() < 0) ChildFail(p.error_fd, kStageGroup, errno);
  } else if (p.group == SpawnOptions::Group::kNewProcessGroup) {
    if (::setpgid(0, 0) != 0) ChildFail(p.error_fd, kStageGroup, errno);
  }

  if (p.death_signal != 0) {
    if (::prctl(PR_SET_PDEATHSIG, p.death_signal) != 0)
      ChildFail(p.error_fd, kStageDeathSignal, errno);
    // The spawner may have died between fork and prctl: then nobody will ever
    // send the death signal, so deliver it now.
    if (::getppid() != p.parent_pid) {
      ::kill(::getpid(), p.death_signal);
      ::_exit(exit_code::kSignalBase + p.death_signal);
    }
  }

  // Move sources that sit on 0..2 out of the way first, so a swap such as
  // stdout=2, stderr=1 does not clobber one with the other.
  int src[3];
  for (int i = 0; i < 3; ++i) {
    src[i] = p.stdio[i];
    if (src[i] >= 0 && src[i] <= 2 && src[i] != i) {
      src[i] = ::fcntl(src[i], F_DUPFD_CLOEXEC, 3);
      if (src[i] < 0) ChildFail(p.error_fd, kStageStdio, errno);
    }
  }
  for (int i = 0; i < 3; ++i) {
    if (src[i] < 0) continue;
    if (src[i] == i) {
      if (::fcntl(i, F_SETFD, 0) != 0) ChildFail(p.error_fd, kStageStdio, errno);
    } else if (::dup2(src[i], i) < 0) {
      ChildFail(p.error_fd, kStageStdio, errno);
    }
  }

  if (p.cwd != nullptr && ::chdir(p.cwd) != 0) ChildFail(p.error_fd, kStageChdir, errno);

  CloseOtherFds(p);
  for (size_t i = 0; i < p.nclear; ++i)
    if (::fcntl(p.clear_cloexec[i], F_SETFD, 0) != 0) ChildFail(p.error_fd, kStageCloseFds, errno);

  ::execve(p.path, p.argv, p.envp);
  ChildFail(p.error_fd, kStageExec, errno);
}

}  // namespace dflash
