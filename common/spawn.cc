#include "common/spawn.h"

#include <dirent.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "common/exit_codes.h"
#include "common/signal_names.h"

extern char** environ;

#ifndef SYS_pidfd_open
#define SYS_pidfd_open 434
#endif
#ifndef SYS_close_range
#define SYS_close_range 436
#endif

namespace dflash {
namespace {

/// What the child reports through the error pipe when it cannot exec.
enum Stage : int { kStageCgroup = 8, kStageSignals = 1, kStageGroup, kStageDeathSignal, kStageStdio, kStageChdir,
                   kStageCloseFds, kStageExec };

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

struct ErrorReport {
  int stage;
  int errnum;
};

/// Everything the child needs, as plain pointers and ints: built in the
/// parent so the child allocates nothing.
struct ChildPlan {
  const char* path;
  char* const* argv;
  char* const* envp;
  const char* cwd;  // nullptr = stay
  int stdio[3];     // source fd for 0/1/2, or -1 to leave as is
  SpawnOptions::Group group;
  int death_signal;
  int cgroup_fd;  // -1: stay in the spawner's cgroup
  pid_t parent_pid;
  const int* keep;  // sorted, includes the error pipe
  size_t nkeep;
  const int* clear_cloexec;  // the caller's keep_fds
  size_t nclear;
  int error_fd;
  long max_fd;  // for the last-resort close loop
};

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

bool IsExecutableFile(const std::string& path) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0 || !S_ISREG(st.st_mode)) return false;
  return ::faccessat(AT_FDCWD, path.c_str(), X_OK, AT_EACCESS) == 0;
}

}  // namespace

int PidfdOpen(pid_t pid) { return static_cast<int>(::syscall(SYS_pidfd_open, pid, 0)); }

bool ResolveProgram(std::string_view name, std::string_view path_var, std::string* out,
                    int* errnum) {
  std::optional<std::string> first_existing;
  size_t start = 0;
  for (;;) {
    size_t end = path_var.find(':', start);
    std::string_view dir = path_var.substr(start, end == std::string_view::npos ? path_var.npos
                                                                               : end - start);
    std::string candidate = dir.empty() ? std::string(name)
                                        : std::string(dir) + "/" + std::string(name);
    if (IsExecutableFile(candidate)) {
      *out = candidate;
      return true;
    }
    if (!first_existing && ::access(candidate.c_str(), F_OK) == 0) {
      struct stat st;
      if (::stat(candidate.c_str(), &st) == 0 && !S_ISDIR(st.st_mode)) first_existing = candidate;
    }
    if (end == std::string_view::npos) break;
    start = end + 1;
  }
  if (first_existing) {
    *out = *first_existing;
    return true;
  }
  *errnum = ENOENT;
  return false;
}

bool Spawn(const SpawnOptions& opts, Child* out, std::string* err) {
  out->pid = -1;
  out->pidfd.reset();
  out->exec_errno = 0;
  out->exit_code = 0;
  if (opts.argv.empty() || opts.argv[0].empty()) {
    if (err) *err = "cannot execute an empty command";
    out->exit_code = exit_code::kNotFound;
    out->exec_errno = ENOENT;
    return false;
  }
  const std::string& program = opts.argv[0];

  // PATH lookup in the parent, with the child's PATH (execvp in the child
  // would allocate and would use the spawner's environment semantics).
  std::string path = program;
  if (program.find('/') == std::string::npos) {
    auto pv = GetEnvVar(opts.env, "PATH");
    std::string_view path_var = pv ? *pv : std::string_view("/usr/local/bin:/usr/bin:/bin");
    int e = 0;
    if (!ResolveProgram(program, path_var, &path, &e)) {
      if (err) *err = "cannot execute '" + program + "': " + std::strerror(e) + " (not found in PATH)";
      out->exec_errno = e;
      out->exit_code = exit_code::kNotFound;
      return false;
    }
  }

  std::vector<char*> argv;
  argv.reserve(opts.argv.size() + 1);
  for (const auto& a : opts.argv) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  std::vector<char*> envp;
  envp.reserve(opts.env.size() + 1);
  for (const auto& e : opts.env) envp.push_back(const_cast<char*>(e.c_str()));
  envp.push_back(nullptr);

  UniqueFd devnull;
  auto stdio_source = [&](int fd, int* src) -> bool {
    if (fd == kInheritFd) {
      *src = -1;
    } else if (fd == kDevNullFd) {
      if (!devnull) devnull.reset(::open("/dev/null", O_RDWR | O_CLOEXEC));
      if (!devnull) {
        if (err) *err = ErrnoMessage("open(/dev/null)", errno);
        return false;
      }
      *src = devnull.get();
    } else {
      *src = fd;
    }
    return true;
  };

  // The error pipe: the child writes {stage, errno} if it cannot exec; EOF
  // (the write end closed by a successful exec) means the program runs. Kept
  // above 2 so dup2 onto stdio cannot overwrite it.
  int pfd[2];
  if (::pipe2(pfd, O_CLOEXEC) != 0) {
    if (err) *err = ErrnoMessage("pipe2", errno);
    return false;
  }
  UniqueFd rd(pfd[0]), wr(pfd[1]);
  if (wr.get() <= 2) {
    wr.reset(::fcntl(wr.get(), F_DUPFD_CLOEXEC, 3));
    if (!wr) {
      if (err) *err = ErrnoMessage("fcntl(F_DUPFD_CLOEXEC)", errno);
      return false;
    }
  }

  ChildPlan plan{};
  plan.path = path.c_str();
  plan.argv = argv.data();
  plan.envp = envp.data();
  plan.cwd = opts.cwd.empty() ? nullptr : opts.cwd.c_str();
  if (!stdio_source(opts.stdin_fd, &plan.stdio[0]) || !stdio_source(opts.stdout_fd, &plan.stdio[1]) ||
      !stdio_source(opts.stderr_fd, &plan.stdio[2]))
    return false;
  plan.group = opts.group;
  plan.death_signal = opts.death_signal;
  plan.cgroup_fd = opts.cgroup_procs_fd;
  plan.parent_pid = ::getpid();
  std::vector<int> keep;
  for (int fd : opts.keep_fds) {
    if (fd <= 2) {
      if (err) *err = "keep_fds must be above 2, got " + std::to_string(fd);
      return false;
    }
    keep.push_back(fd);
  }
  std::vector<int> clear = keep;
  keep.push_back(wr.get());
  std::sort(keep.begin(), keep.end());
  plan.keep = keep.data();
  plan.nkeep = keep.size();
  plan.clear_cloexec = clear.data();
  plan.nclear = clear.size();
  plan.error_fd = wr.get();
  struct rlimit rl;
  plan.max_fd = (::getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY)
                    ? static_cast<long>(std::min<rlim_t>(rl.rlim_cur, 1 << 20))
                    : 65536;

  // Block every signal across fork so no handler of ours runs in the child
  // before it has reset dispositions; the parent restores its mask at once.
  sigset_t all, old;
  sigfillset(&all);
  ::pthread_sigmask(SIG_SETMASK, &all, &old);
  pid_t pid = ::fork();
  if (pid == 0) RunChild(plan);
  int fork_errno = errno;
  ::pthread_sigmask(SIG_SETMASK, &old, nullptr);
  if (pid < 0) {
    if (err) *err = "cannot execute '" + program + "': " + ErrnoMessage("fork", fork_errno);
    return false;
  }
  wr.reset();
  out->pid = pid;
  out->pidfd.reset(PidfdOpen(pid));  // works on a zombie too; invalid if unsupported

  out->exec_status = std::move(rd);
  out->exec_program = path;
  out->exec_stage_detail = opts.cwd;
  out->exec_name = program;
  // Without waiting, the caller learns the outcome later (FinishSpawn), and
  // its next fork overlaps this child's exec.
  if (!opts.wait_for_exec) return true;
  return FinishSpawn(out, err);
}

bool FinishSpawn(Child* out, std::string* err) {
  if (!out->exec_status) return out->exec_errno == 0;
  UniqueFd rd = std::move(out->exec_status);
  ErrorReport report{};
  size_t got = 0;
  while (got < sizeof report) {
    pollfd pfd{rd.get(), POLLIN, 0};
    ssize_t n = ::read(rd.get(), reinterpret_cast<char*>(&report) + got, sizeof report - got);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && errno == EAGAIN) {  // not yet decided: wait for exec or for the report
      ::poll(&pfd, 1, -1);
      continue;
    }
    if (n <= 0) break;
    got += static_cast<size_t>(n);
  }
  if (got == 0) return true;  // EOF: exec succeeded
  if (got < sizeof report) report = {kStageExec, EIO};

  out->exec_errno = report.errnum;
  out->exit_code = report.stage == kStageExec && (report.errnum == ENOENT || report.errnum == ENOTDIR)
                       ? exit_code::kNotFound
                       : exit_code::kNotExecutable;
  if (err) {
    if (report.stage == kStageExec) {
      *err = "cannot execute '" + out->exec_program + "': " + std::strerror(report.errnum);
    } else {
      std::string what = StageName(report.stage);
      if (report.stage == kStageChdir) what += "(" + out->exec_stage_detail + ")";
      *err = "cannot start '" + out->exec_name + "': " + ErrnoMessage(what, report.errnum);
    }
  }
  return false;
}

int ExitStatus::ExitCode() const {
  if (signaled) return exit_code::kSignalBase + signal;
  return code;
}

std::string ExitStatus::Describe() const {
  if (signaled)
    return "killed by " + SignalName(signal) + (core_dumped ? " (core dumped)" : "");
  return "exited with code " + std::to_string(code);
}

ExitStatus DecodeWaitStatus(int status) {
  ExitStatus s;
  if (WIFEXITED(status)) {
    s.exited = true;
    s.code = WEXITSTATUS(status);
  } else if (WIFSIGNALED(status)) {
    s.signaled = true;
    s.signal = WTERMSIG(status);
    s.core_dumped = WCOREDUMP(status);
  }
  return s;
}

int ExitCodeFromWaitStatus(int status) { return DecodeWaitStatus(status).ExitCode(); }

bool WaitForChild(pid_t pid, ExitStatus* out, std::string* err) {
  int status = 0;
  for (;;) {
    pid_t r = ::waitpid(pid, &status, 0);
    if (r == pid) break;
    if (r < 0 && errno == EINTR) continue;
    if (err) *err = ErrnoMessage("waitpid(" + std::to_string(pid) + ")", errno);
    return false;
  }
  *out = DecodeWaitStatus(status);
  return true;
}

std::vector<std::string> CurrentEnvironment() {
  std::vector<std::string> env;
  for (char** e = environ; e != nullptr && *e != nullptr; ++e) env.emplace_back(*e);
  return env;
}

namespace {
bool IsVar(std::string_view entry, std::string_view name) {
  return entry.size() > name.size() && entry[name.size()] == '=' &&
         entry.compare(0, name.size(), name) == 0;
}
}  // namespace

void UnsetEnvVar(std::vector<std::string>* env, std::string_view name) {
  std::erase_if(*env, [&](const std::string& e) { return IsVar(e, name); });
}

void SetEnvVar(std::vector<std::string>* env, std::string_view name, std::string_view value) {
  UnsetEnvVar(env, name);
  std::string entry(name);
  entry += '=';
  entry += value;
  env->push_back(std::move(entry));
}

std::optional<std::string_view> GetEnvVar(const std::vector<std::string>& env,
                                          std::string_view name) {
  // The first definition, as the child's getenv() will see it.
  for (const auto& e : env)
    if (IsVar(e, name)) return std::string_view(e).substr(name.size() + 1);
  return std::nullopt;
}

}  // namespace dflash
