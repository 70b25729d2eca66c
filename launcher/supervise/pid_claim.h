// A pid a payload reports (MAINPID=) is a claim, not a fact: the supervisor
// signals, kills and measures by it only after checking it against what it
// owns (the attempt's cgroup leaf, the session it spawned), and checks again
// before each signal, because pids are reused (systemd does the same: MAINPID
// is accepted only for a process of the unit's cgroup).
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <string>

namespace dflash {

/// A pid that passed CheckPidClaim, with what tells it from a later reuse.
struct VerifiedPid {
  pid_t pid = -1;
  uint64_t start_time = 0;   ///< /proc/<pid>/stat field 22 when it was verified
  bool leads_group = false;  ///< its pgid was its pid: kill(-pid) reaches only its own group
  bool valid() const { return pid > 1; }
};

/// Accepts `claimed` only if it is a live process of the tree the supervisor
/// spawned as `session_leader` (a child in a session of its own): in that
/// session, a descendant of it, or in the cgroup directory `cgroup_leaf` (or
/// below; empty without cgroups). Never pid 1 or less, the supervisor itself,
/// or a process of the supervisor's own process group or session (the
/// guardian, a private store are not in the tree either). False with `why`
/// when it is refused.
bool CheckPidClaim(pid_t claimed, pid_t session_leader, const std::string& cgroup_leaf, VerifiedPid* out,
                   std::string* why);

/// Signals the verified process: its whole group when it led one, else the
/// process alone; nothing (false) once it is reaped or its pid names another
/// process now (a start time that changed): what is left of its group is then
/// the cgroup's or the orphan sweep's to find.
bool SignalVerified(const VerifiedPid& v, int sig);

}  // namespace dflash
