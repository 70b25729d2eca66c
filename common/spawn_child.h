// The spawn core's child side (common/spawn.h): what the child does between
// fork and exec, from a plan the parent made. Only spawn.cc uses it.
#pragma once

#include <sys/types.h>

#include <cstddef>

#include "common/spawn.h"

namespace dflash {

/// What the child reports through the error pipe when it cannot exec.
enum Stage : int { kStageCgroup = 8, kStageSignals = 1, kStageGroup, kStageDeathSignal, kStageStdio, kStageChdir,
                   kStageCloseFds, kStageExec };

/// "execve", "chdir", ...: what the child was doing when it reported `stage`.
const char* StageName(int stage);

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

/// Runs in the child between fork and exec: async-signal-safe calls only (it
/// allocates nothing, logs nothing, takes no lock). Execs `p.path`, or writes an
/// ErrorReport to `p.error_fd` and exits 127 or 126.
[[noreturn]] void RunChild(const ChildPlan& p);

}  // namespace dflash
