// Test support: starting a helper process (a CLI under test, a contender, a shell script) and
// waiting for it. posix_spawn, so it is safe from a test that runs threads.
#pragma once

#include <sys/types.h>

#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "common/fd.h"

namespace dflash::test {

/// Where one of the child's output streams goes.
struct Output {
  enum class Kind { kInherit, kPipe, kFile, kDevNull };
  Kind kind = Kind::kPipe;
  std::string path;  ///< kFile: created or truncated, 0600

  static Output Inherit() { return {Kind::kInherit, ""}; }
  static Output Pipe() { return {Kind::kPipe, ""}; }
  static Output File(std::string p) { return {Kind::kFile, std::move(p)}; }
  static Output DevNull() { return {Kind::kDevNull, ""}; }
};

struct ProcessOptions {
  /// argv[0] without a '/' is looked up in PATH.
  std::vector<std::string> argv{};
  /// The whole environment; unset: this process's (plus `set_env`).
  std::optional<std::vector<std::string>> env{};
  /// NAME, VALUE pairs set on top of `env`.
  std::vector<std::pair<std::string, std::string>> set_env{};
  Output out = Output::Pipe();
  Output err = Output::Pipe();
  /// {fd here, fd in the child}: dup2'd in the child (e.g. a start barrier's read end as fd 100).
  std::vector<std::pair<int, int>> fds{};
  /// A session of its own (setsid): signals to the test's group do not reach it.
  bool new_session = false;
};

/// A started child; its pipe ends (if asked for) are O_CLOEXEC here. The caller reaps it
/// (WaitForExit), or the test leaves a zombie behind.
struct Process {
  pid_t pid = -1;
  UniqueFd out, err;
};

/// Starts `o.argv` with stdin from /dev/null, an empty signal mask and default signal
/// dispositions (whatever the test blocked or ignored does not leak into the child).
bool StartProcess(const ProcessOptions& o, Process* p, std::string* err);

/// Starts `argv` (this environment) with stdout and stderr inherited: a helper whose output the
/// test does not read. Its pid, or -1 and a test failure.
pid_t StartHelper(std::vector<std::string> argv);

/// waitpid(pid), EINTR retried: the raw wait status, or -1 if `pid` is not our child.
int WaitForExit(pid_t pid);

/// A raw wait status as a shell reports it: the exit code, or 128+N for death by signal N; -1 otherwise.
int ExitCodeOf(int wait_status);

struct Finished {
  int status = -1;     ///< raw wait status (-1: it did not start)
  int exit_code = -1;  ///< ExitCodeOf(status)
  std::string out, err;
};

/// Starts `o`, reads its piped stdout and stderr to EOF (both at once: neither pipe can fill up
/// and stall the child) and reaps it. A test failure if it cannot be started.
Finished RunProcess(const ProcessOptions& o);

/// RunProcess with argv only: this environment, stdout and stderr captured.
Finished RunProcess(std::vector<std::string> argv);

}  // namespace dflash::test
