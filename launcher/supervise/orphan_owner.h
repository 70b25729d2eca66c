// Which leftover processes are the run's to kill, and whose they were: the
// rule of the supervisor's orphan sweep (docs/design.md, "Nothing outlives the
// run"). A child of the supervisor that is none of the run's processes was
// re-parented to it (PR_SET_CHILD_SUBREAPER): a payload's own child, left
// behind by a process that ended, or still working for one that lives. Pure:
// the shell reads /proc and kills (supervisor_reap.cc SweepOrphans), this decides
// (orphan_owner_test.cc).
#pragma once

#include <sys/types.h>

#include <optional>
#include <string>
#include <vector>

namespace dflash {

/// One of the run's processes as the rule sees it.
struct RunProcess {
  std::string name;  ///< its ProcessPlan name ("train:0"), what DFLASH_PROCESS says
  pid_t pid = -1;    ///< the current attempt's, while it lives (its session id: it leads one)
  int attempt = 0;
  bool alive = false;
};

/// What the sweep read of one orphan: /proc/<pid>/stat and its environment at exec
/// (which survives setsid and double fork).
struct Orphan {
  pid_t pid = -1;
  pid_t sid = -1;
  pid_t pgid = -1;
  std::optional<std::string> run_token;  ///< DFLASH_RUN_TOKEN
  std::optional<std::string> process;    ///< DFLASH_PROCESS
  std::optional<std::string> attempt;    ///< DFLASH_ATTEMPT
};

struct OrphanVerdict {
  bool kill = false;
  int owner = -1;          ///< index in the run's processes; -1: nobody's we know
  bool kill_group = false; ///< its process group too: not init's, not the supervisor's own
  std::string whose;       ///< for the log: "train:0 (ended)", "an unknown process"
};

/// The rule: an orphan is its owner's while that owner lives, on the same attempt,
/// and the run goes on; everything else is killed: an ended owner's, an earlier
/// attempt's, nobody's we know, and all of them once `run_ending`. The owner is the
/// process its environment names, if it carries this run's `run_token` (another
/// run's names mean nothing here), else the process whose session it is in.
/// The run's processes themselves are never orphans.
OrphanVerdict JudgeOrphan(const Orphan& orphan, const std::vector<RunProcess>& processes,
                          const std::string& run_token, pid_t own_group, bool run_ending);

}  // namespace dflash
