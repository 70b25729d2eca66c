#include "common/spawn.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
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
#include "common/spawn_child.h"

extern char** environ;

#ifndef SYS_pidfd_open
#define SYS_pidfd_open 434
#endif

namespace dflash {
namespace {

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

namespace {

/// PATH lookup in the parent, with the child's PATH (execvp in the child
/// would allocate and would use the spawner's environment semantics).
bool ResolveSpawnPath(const SpawnOptions& opts, std::string* path, Child* out, std::string* err) {
  const std::string& program = opts.argv[0];
  *path = program;
  if (program.find('/') != std::string::npos) return true;
  auto pv = GetEnvVar(opts.env, "PATH");
  std::string_view path_var = pv ? *pv : std::string_view("/usr/local/bin:/usr/bin:/bin");
  int e = 0;
  if (ResolveProgram(program, path_var, path, &e)) return true;
  if (err) *err = "cannot execute '" + program + "': " + std::strerror(e) + " (not found in PATH)";
  out->exec_errno = e;
  out->exit_code = exit_code::kNotFound;
  return false;
}

/// A NULL-terminated array of pointers into `strings` (which must outlive it).
std::vector<char*> CStringArray(const std::vector<std::string>& strings) {
  std::vector<char*> v;
  v.reserve(strings.size() + 1);
  for (const auto& s : strings) v.push_back(const_cast<char*>(s.c_str()));
  v.push_back(nullptr);
  return v;
}

/// The error pipe: the child writes {stage, errno} if it cannot exec; EOF
/// (the write end closed by a successful exec) means the program runs. Kept
/// above 2 so dup2 onto stdio cannot overwrite it.
bool OpenErrorPipe(UniqueFd* rd, UniqueFd* wr, std::string* err) {
  int pfd[2];
  if (::pipe2(pfd, O_CLOEXEC) != 0) {
    if (err) *err = ErrnoMessage("pipe2", errno);
    return false;
  }
  rd->reset(pfd[0]);
  wr->reset(pfd[1]);
  if (wr->get() <= 2) {
    wr->reset(::fcntl(wr->get(), F_DUPFD_CLOEXEC, 3));
    if (!*wr) {
      if (err) *err = ErrnoMessage("fcntl(F_DUPFD_CLOEXEC)", errno);
      return false;
    }
  }
  return true;
}

/// What the child's ChildPlan points into: owned by the parent until fork returns.
struct ChildPlanStorage {
  std::string path;
  std::vector<char*> argv, envp;
  UniqueFd devnull;
  std::vector<int> keep, clear;
};

/// The source fd for one of the child's stdio fds (-1: inherit), opening /dev/null once if asked.
bool StdioSource(int fd, UniqueFd* devnull, int* src, std::string* err) {
  if (fd == kInheritFd) {
    *src = -1;
  } else if (fd == kDevNullFd) {
    if (!*devnull) devnull->reset(::open("/dev/null", O_RDWR | O_CLOEXEC));
    if (!*devnull) {
      if (err) *err = ErrnoMessage("open(/dev/null)", errno);
      return false;
    }
    *src = devnull->get();
  } else {
    *src = fd;
  }
  return true;
}

/// Everything the child will do, decided here in the parent: `storage` owns what `plan` points into.
bool MakeChildPlan(const SpawnOptions& opts, int error_fd, ChildPlanStorage* storage, ChildPlan* plan,
                   std::string* err) {
  plan->path = storage->path.c_str();
  plan->argv = storage->argv.data();
  plan->envp = storage->envp.data();
  plan->cwd = opts.cwd.empty() ? nullptr : opts.cwd.c_str();
  if (!StdioSource(opts.stdin_fd, &storage->devnull, &plan->stdio[0], err) ||
      !StdioSource(opts.stdout_fd, &storage->devnull, &plan->stdio[1], err) ||
      !StdioSource(opts.stderr_fd, &storage->devnull, &plan->stdio[2], err))
    return false;
  plan->group = opts.group;
  plan->death_signal = opts.death_signal;
  plan->cgroup_fd = opts.cgroup_procs_fd;
  plan->parent_pid = ::getpid();
  std::vector<int>& keep = storage->keep;
  for (int fd : opts.keep_fds) {
    if (fd <= 2) {
      if (err) *err = "keep_fds must be above 2, got " + std::to_string(fd);
      return false;
    }
    keep.push_back(fd);
  }
  storage->clear = keep;
  keep.push_back(error_fd);
  std::sort(keep.begin(), keep.end());
  plan->keep = keep.data();
  plan->nkeep = keep.size();
  plan->clear_cloexec = storage->clear.data();
  plan->nclear = storage->clear.size();
  plan->error_fd = error_fd;
  struct rlimit rl;
  plan->max_fd = (::getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY)
                     ? static_cast<long>(std::min<rlim_t>(rl.rlim_cur, 1 << 20))
                     : 65536;
  return true;
}

/// Forks; the child carries out `plan` and never returns. Returns the child's
/// pid, or -1 with `*fork_errno`.
pid_t ForkChild(const ChildPlan& plan, int* fork_errno) {
  // Block every signal across fork so no handler of ours runs in the child
  // before it has reset dispositions; the parent restores its mask at once.
  sigset_t all, old;
  sigfillset(&all);
  ::pthread_sigmask(SIG_SETMASK, &all, &old);
  pid_t pid = ::fork();
  if (pid == 0) RunChild(plan);
  *fork_errno = errno;
  ::pthread_sigmask(SIG_SETMASK, &old, nullptr);
  return pid;
}

}  // namespace

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
  ChildPlanStorage storage;
  if (!ResolveSpawnPath(opts, &storage.path, out, err)) return false;
  storage.argv = CStringArray(opts.argv);
  storage.envp = CStringArray(opts.env);
  UniqueFd rd, wr;
  if (!OpenErrorPipe(&rd, &wr, err)) return false;
  ChildPlan plan{};
  if (!MakeChildPlan(opts, wr.get(), &storage, &plan, err)) return false;

  int fork_errno = 0;
  pid_t pid = ForkChild(plan, &fork_errno);
  if (pid < 0) {
    if (err) *err = "cannot execute '" + program + "': " + ErrnoMessage("fork", fork_errno);
    return false;
  }
  wr.reset();
  out->pid = pid;
  out->pidfd.reset(PidfdOpen(pid));  // works on a zombie too; invalid if unsupported

  out->exec_status = std::move(rd);
  out->exec_program = storage.path;
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
