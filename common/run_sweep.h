// Finding and killing every process of one run without cgroups: by a marker
// the kernel keeps across fork, setsid and double-fork (the environment a
// process was exec'd with, /proc/<pid>/environ), and by the sessions the
// supervisor started. Used by dflash-guardian after the supervisor died, and
// by the supervisor to tell whose leftover a re-parented orphan is.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace dflash {

/// The environment variable that marks every process of one run. Its value is
/// unique per run (the run id is not: tests and users reuse "--run-id r").
inline constexpr const char kRunTokenVar[] = "DFLASH_RUN_TOKEN";

/// A fresh token: "<pid>-<start ticks>-<16 hex of /dev/urandom>".
std::string NewRunToken();

/// The value of `name` in /proc/<pid>/environ (the environment the process
/// was exec'd with), if readable and set.
std::optional<std::string> EnvironValue(pid_t pid, std::string_view name);

/// The pids listed in /proc/self/task/*/children: this process's children,
/// without scanning all of /proc (O(children)). Zombies included.
std::vector<pid_t> OwnChildren();

struct SweepTarget {
  std::string token;               ///< kill processes whose environ has DFLASH_RUN_TOKEN=token
  std::vector<pid_t> sessions;     ///< ... or that are in one of these sessions
  uint64_t not_before = 0;         ///< ... and started at or after this (clock ticks): no reused ids
  std::vector<pid_t> spare;        ///< never these (the sweeper itself)
};

/// One pass over /proc: the live processes of this uid matching `t`.
std::vector<pid_t> FindRunProcesses(const SweepTarget& t);

/// SIGKILLs every match, scanning again while a pass still finds one (a
/// process forking while it is killed shows up in the next pass), at most
/// `max_passes` times. Returns how many kills were sent; `killed` lists them.
int SweepRun(const SweepTarget& t, int max_passes, std::vector<pid_t>* killed);

}  // namespace dflash
