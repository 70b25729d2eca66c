// What this host lets one run start, checked by `check` and `run` before
// anything is spawned: a 1 MB argument, a 200 KB env value or 40,960
// processes on a host of pid_max 32768 used to pass `check` and fail only
// at exec (126, E2BIG) or fork (EAGAIN), after the other processes started.
#pragma once

#include <cstddef>
#include <vector>

#include "launcher/config/config_error.h"
#include "launcher/plan/plan.h"

namespace dflash {

struct HostLimits {
  size_t arg_max = 0;             ///< sysconf(_SC_ARG_MAX): argv + envp of one execve, strings and pointers
  size_t max_arg_strlen = 131072;  ///< MAX_ARG_STRLEN (32 pages, a kernel constant): one string, its NUL included
  long free_pids = 0;             ///< /proc/sys/kernel/pid_max less the tasks now (0: unknown)
  long nproc_limit = -1;          ///< RLIMIT_NPROC's soft limit; -1: none (unlimited, or root, whom it does not bind)
  long user_processes = 0;        ///< tasks this user runs now (they count against nproc_limit)
};

/// This host's limits, for this process's user.
HostLimits ReadHostLimits();

/// One error per process whose argv or environment (what `inherited`, the
/// launcher's own environment, and Plan::ProcessEnv give it) execve would
/// refuse, at the key that makes it too big; one if this node's processes
/// (with their dflash-worker, if any) cannot be forked under `limits`.
std::vector<ConfigError> CheckHostLimits(const Plan& plan, const EnvList& inherited, const HostLimits& limits);

}  // namespace dflash
