// A gate holder's process tree: every process started on the holder's behalf
// carries DFLASH_GATE_HOLDER=<token> in its environment, a mark that survives
// setsid, double forks and re-parenting. The next leader kills what is left of
// a dead holder's tree before it compiles (one compile at a time, really), and
// a waiter measures the tree's CPU to tell a compiling leader from a blocked one.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <string>
#include <vector>

#include "cachelock/records.h"
#include "contract/env_vars.h"

namespace dflash {

inline constexpr const char* kHolderEnvVar = env::kGateHolder;

/// "<pid>.<start_time>": one holder for ever (pids are reused, start times are not).
std::string HolderToken(const OwnerRecord& holder);

/// Processes of this uid whose environment holds DFLASH_GATE_HOLDER=<token>
/// (this process excluded). A racy snapshot of /proc; a process that scrubbed
/// its environment is not found (docs/cachelock.md says so).
std::vector<pid_t> HolderTreePids(const std::string& token);

/// SIGKILLs every process of the tree until none is left or `wait` has passed;
/// returns how many it killed. False if some were still there at the deadline
/// (unkillable: D state), with their pids in `err`.
bool KillHolderTree(const std::string& token, std::chrono::milliseconds wait, int* killed, std::string* err);

/// CPU seconds (user + system, their reaped children's included) the processes `pids` have used so far.
double HolderTreeCpuSeconds(const std::vector<pid_t>& pids);
/// The same for the tree HolderTreePids(token) finds now.
double HolderTreeCpuSeconds(const std::string& token);

/// Whether a holder tree that used `used_cpu_s` of CPU over `window_s` is blocked rather than compiling:
/// under 2% of one core (compiling keeps at least one busy). Less CPU than at the window's start (a
/// process of the tree ended and took its count along) is never idle: that process ran.
inline bool HolderTreeLooksIdle(double used_cpu_s, double window_s) {
  return used_cpu_s >= 0 && used_cpu_s < 0.02 * window_s;
}

}  // namespace dflash
