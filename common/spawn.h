// The POSIX spawn core: fork + exec with every fd, signal and session detail
// decided in the parent, and exec failures reported back through a pipe.
// Used by the supervisor (dflash-launch) and by the worker's payload host.
// docs/design.md explains why this is hand-written rather than Boost.Process.
#pragma once

#include <sys/types.h>

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/fd.h"

namespace dflash {

/// Values for SpawnOptions' stdio fields besides a real fd.
constexpr int kInheritFd = -1;  ///< the child shares the spawner's fd
constexpr int kDevNullFd = -2;  ///< the child gets /dev/null

/// Everything about a child that is decided before fork(). The child itself
/// only executes a prepared plan: no allocation, no locks, no logging between
/// fork and exec (the spawner may be multi-threaded; spdlog is not fork-safe).
struct SpawnOptions {
  /// argv[0] is the program: a path (contains '/') used as is, or a name
  /// looked up in the PATH of `env` (not of the spawner), as execvp would.
  std::vector<std::string> argv;
  /// The child's whole environment, "NAME=value" entries (see
  /// CurrentEnvironment / SetEnvVar). Nothing is inherited implicitly.
  std::vector<std::string> env;
  /// Working directory of the child; empty = the spawner's.
  std::string cwd;

  /// Stdio: an fd of the spawner dup2'ed onto 0/1/2, kInheritFd or kDevNullFd.
  /// Stdin defaults to /dev/null so no child ever competes for a terminal.
  int stdin_fd = kDevNullFd;
  int stdout_fd = kInheritFd;
  int stderr_fd = kInheritFd;

  /// Own process group (so signals go to a whole payload tree with one
  /// kill(-pgid)), own session (also detaches from the terminal), or neither.
  enum class Group { kInherit, kNewProcessGroup, kNewSession };
  Group group = Group::kNewProcessGroup;

  /// PR_SET_PDEATHSIG: the signal the child gets when the spawning *thread*
  /// exits (0 = none). The child then checks getppid() against the spawner's
  /// pid and kills itself with the same signal if the spawner is already gone.
  /// REQUIRES: the spawning thread lives as long as the child should.
  int death_signal = 0;

  /// A cgroup v2 `cgroup.procs` of the spawner's (O_CLOEXEC), or -1: the child
  /// writes "0" into it first thing, so it and everything it will ever start
  /// live in that cgroup (one cgroup.kill ends the whole tree).
  int cgroup_procs_fd = -1;

  /// Extra fds (> 2) the child keeps at the same number (their close-on-exec
  /// flag is cleared in the child). Every other fd above 2 is closed.
  std::vector<int> keep_fds;

  /// True: Spawn returns once the exec has succeeded or failed. False: Spawn
  /// returns right after fork with Child::exec_status pending, so a caller
  /// starting many children overlaps their execs; it then calls FinishSpawn
  /// (when exec_status is readable, or once the child has exited).
  bool wait_for_exec = true;
};

/// A started (or failed-to-start) child.
struct Child {
  pid_t pid = -1;
  /// pidfd of the child (pollable: readable once it exits); invalid when the
  /// kernel has no pidfd_open (Linux < 5.3). Callers may rely on SIGCHLD.
  UniqueFd pidfd;
  /// When exec failed: the errno and the exit code the caller must report
  /// (127 not found, 126 anything else). The child has already _exit()ed with
  /// that code; if `pid` > 0 it still has to be reaped by the owner's reaper.
  int exec_errno = 0;
  int exit_code = 0;
  /// With wait_for_exec = false: readable (EOF, or an error report) once the
  /// exec is decided; O_CLOEXEC. Empty once FinishSpawn has read it.
  UniqueFd exec_status;
  std::string exec_program, exec_name, exec_stage_detail;  // for FinishSpawn's message
};

/// Starts a child. True when the program is running (exec succeeded: the
/// close-on-exec error pipe reached EOF). False with `err` set otherwise, e.g.
/// "cannot execute 'foo': No such file or directory" and out->exit_code set;
/// out->pid > 0 then names a child that exited with that code and must be
/// reaped (no zombie is left if the caller's reaper runs; none exists if the
/// failure happened before fork, e.g. a name not found in PATH).
bool Spawn(const SpawnOptions& opts, Child* out, std::string* err);

/// Reads a pending exec outcome (Child::exec_status): true if the program
/// runs; false with `err` and out->exit_code (127/126) if its exec failed.
/// Blocks until the exec is decided (never long: the child does nothing else).
bool FinishSpawn(Child* out, std::string* err);

/// How a child ended, from a wait status.
struct ExitStatus {
  bool exited = false;     ///< exit() / return from main
  int code = 0;            ///< exit code when `exited`
  bool signaled = false;   ///< killed by a signal
  int signal = 0;          ///< the signal when `signaled`
  bool core_dumped = false;

  /// The shell convention: the exit code, or 128+N when killed by signal N.
  /// (Boost.Process v1's exit_code() returns N here, so `exit 9` and SIGKILL
  /// look the same; this never conflates them.)
  int ExitCode() const;
  /// "exited with code 3", "killed by SIGSEGV (core dumped)".
  std::string Describe() const;
};

/// Decodes a waitpid() status.
ExitStatus DecodeWaitStatus(int status);
/// Shorthand: DecodeWaitStatus(status).ExitCode().
int ExitCodeFromWaitStatus(int status);

/// Blocking waitpid(pid) retried on EINTR, for callers that own no reaper
/// loop (tests, one-shot tools). REQUIRES: nothing else reaps `pid`.
bool WaitForChild(pid_t pid, ExitStatus* out, std::string* err);

/// The PATH search execvp does, done in the parent: the first regular,
/// executable file `name` in `path_var` (colon-separated, empty entry = ".").
/// If none is executable but one exists, that one (exec then fails with
/// EACCES -> 126). False with *errnum = ENOENT if nothing exists.
bool ResolveProgram(std::string_view name, std::string_view path_var, std::string* out,
                    int* errnum);

/// This process's environment as "NAME=value" entries.
std::vector<std::string> CurrentEnvironment();
/// Sets (replacing every earlier definition) or removes one variable.
void SetEnvVar(std::vector<std::string>* env, std::string_view name, std::string_view value);
void UnsetEnvVar(std::vector<std::string>* env, std::string_view name);
/// The value of `name` in `env`, if set.
std::optional<std::string_view> GetEnvVar(const std::vector<std::string>& env,
                                          std::string_view name);

/// pidfd_open(2) through syscall(2) (glibc < 2.36 has no wrapper); -1 with
/// errno set on failure. The fd is close-on-exec, as every pidfd is.
int PidfdOpen(pid_t pid);

}  // namespace dflash
