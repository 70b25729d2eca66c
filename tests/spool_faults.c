/* Faults at the system calls under libdflash_spool.so, LD_PRELOADed into a test's child process
 * (tests/test_spool_ring.py): the spool's protocol is C++ now, so a test kills it or takes a kernel feature away
 * where the library meets the kernel, not by patching a Python module.
 *   DFI_KILL_RENAME_INTO=<text>  SIGKILL at a renameat2(RENAME_NOREPLACE) whose target path contains <text>
 *   DFI_NO_EXCHANGE=1            renameat2(RENAME_EXCHANGE) fails with EINVAL (a filesystem without it)
 *   DFI_KILL_MID_WRITEV=1        a writev of 64 KiB or more writes half its first buffer, then SIGKILL
 *   DFI_NO_PAGEMAP=1             open("/proc/self/pagemap") fails with EACCES (no /proc, a hardened kernel) */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>  /* renameat2, RENAME_* */
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/uio.h>
#include <unistd.h>

int renameat2(int olddirfd, const char* oldpath, int newdirfd, const char* newpath, unsigned int flags) {
  int (*real)(int, const char*, int, const char*, unsigned int) = dlsym(RTLD_NEXT, "renameat2");
  const char* into = getenv("DFI_KILL_RENAME_INTO");
  if (into && (flags & RENAME_NOREPLACE) && strstr(newpath, into)) kill(getpid(), SIGKILL);
  if (getenv("DFI_NO_EXCHANGE") && (flags & RENAME_EXCHANGE)) {
    errno = EINVAL;
    return -1;
  }
  return real(olddirfd, oldpath, newdirfd, newpath, flags);
}

ssize_t writev(int fd, const struct iovec* iov, int n) {
  ssize_t (*real)(int, const struct iovec*, int) = dlsym(RTLD_NEXT, "writev");
  size_t total = 0;
  for (int i = 0; i < n; ++i) total += iov[i].iov_len;
  if (getenv("DFI_KILL_MID_WRITEV") && n > 0 && total >= 65536) {
    struct iovec half = {iov[0].iov_base, iov[0].iov_len / 2};
    real(fd, &half, 1);
    kill(getpid(), SIGKILL);
  }
  return real(fd, iov, n);
}

static int refused(const char* path) {
  if (getenv("DFI_NO_PAGEMAP") && strcmp(path, "/proc/self/pagemap") == 0) {
    errno = EACCES;
    return 1;
  }
  return 0;
}

int open(const char* path, int flags, ...) {
  int (*real)(const char*, int, ...) = dlsym(RTLD_NEXT, "open");
  va_list ap;
  va_start(ap, flags);
  mode_t mode = (flags & (O_CREAT | O_TMPFILE)) ? va_arg(ap, mode_t) : 0;
  va_end(ap);
  return refused(path) ? -1 : real(path, flags, mode);
}

int open64(const char* path, int flags, ...) {
  int (*real)(const char*, int, ...) = dlsym(RTLD_NEXT, "open64");
  va_list ap;
  va_start(ap, flags);
  mode_t mode = (flags & (O_CREAT | O_TMPFILE)) ? va_arg(ap, mode_t) : 0;
  va_end(ap);
  return refused(path) ? -1 : real(path, flags, mode);
}
