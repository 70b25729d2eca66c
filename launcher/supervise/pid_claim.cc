#include "launcher/supervise/pid_claim.h"

#include <unistd.h>

#include <csignal>

#include "common/proc_info.h"
#include "common/proc_scan.h"
#include "launcher/supervise/cgroup_tree.h"

namespace dflash {
namespace {

/// How far up the parent chain a descendant is looked for (a payload's tree is
/// shallow; a loop in a racy snapshot must still end).
constexpr int kMaxDepth = 64;

bool DescendsFrom(const ProcStat& st, pid_t ancestor) {
  ProcStat cur = st;
  for (int d = 0; d < kMaxDepth && cur.ppid > 1; ++d) {
    if (cur.ppid == ancestor) return true;
    if (!ReadProcStat(cur.ppid, &cur)) return false;
  }
  return false;
}

bool InCgroup(pid_t pid, const std::string& leaf) {
  if (leaf.empty()) return false;
  std::string dir, err;
  if (!ProcessCgroupDir(pid, &dir, &err)) return false;
  return dir == leaf || dir.rfind(leaf + "/", 0) == 0;
}

}  // namespace

bool CheckPidClaim(pid_t claimed, pid_t session_leader, const std::string& cgroup_leaf, VerifiedPid* out,
                   std::string* why) {
  std::string who = "MAINPID=" + std::to_string(claimed);
  if (claimed <= 1) {
    *why = who + " names no process of its own";
    return false;
  }
  if (claimed == ::getpid()) {
    *why = who + " names a process of the supervisor";
    return false;
  }
  ProcStat st;
  uint64_t start = ProcessStartTime(claimed);
  if (start == 0 || !ReadProcStat(claimed, &st) || st.state == 'Z') {
    *why = who + " names no live process";
    return false;
  }
  if (st.pgid == ::getpgrp() || st.sid == ::getsid(0)) {
    *why = who + " is in the supervisor's own process group or session";
    return false;
  }
  bool ours = claimed == session_leader || st.sid == session_leader || DescendsFrom(st, session_leader) ||
              InCgroup(claimed, cgroup_leaf);
  if (!ours) {
    *why = who + " is not in the process tree the supervisor started (pid " + std::to_string(session_leader) +
           (cgroup_leaf.empty() ? "" : ", cgroup " + cgroup_leaf) + ")";
    return false;
  }
  // Read once more: the pid must still be the process we just looked at.
  if (ProcessStartTime(claimed) != start) {
    *why = who + " changed while it was checked";
    return false;
  }
  out->pid = claimed;
  out->start_time = start;
  out->leads_group = st.pgid == claimed;
  return true;
}

bool SignalVerified(const VerifiedPid& v, int sig) {
  // A zombie still holds its pid (and its group's id): only a start time that
  // changed, or no process at all, means the number may name someone else now.
  if (!v.valid() || ProcessStartTime(v.pid) != v.start_time) return false;
  return ::kill(v.leads_group ? -v.pid : v.pid, sig) == 0;
}

}  // namespace dflash
