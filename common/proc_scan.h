// A scan of /proc for the process tree facts the spawner and its tests need:
// parent, process group, session and state (to find zombies) of each process.
#pragma once

#include <sys/types.h>

#include <vector>

namespace dflash {

/// The fields of /proc/<pid>/stat this project reads.
struct ProcStat {
  pid_t pid = 0;
  char state = '?';  ///< 'R', 'S', 'Z' (zombie), ...
  pid_t ppid = 0;
  pid_t pgid = 0;
  pid_t sid = 0;
};

/// Reads /proc/<pid>/stat; false if the process does not exist (any more).
bool ReadProcStat(pid_t pid, ProcStat* out);

/// Every process whose parent is `parent`, zombies included. A racy snapshot:
/// processes come and go while /proc is listed.
std::vector<ProcStat> ChildrenOf(pid_t parent);

/// The zombie children of `parent`: what a reaper left unreaped.
std::vector<pid_t> ZombieChildrenOf(pid_t parent);

/// Every process of /proc with its stat (one that ends meanwhile is left out).
std::vector<ProcStat> AllProcesses();

/// `root`, every process below it (by parent) and every process of its session
/// (a spawned process leads a session of its own; a daemon it double-forked
/// stays in it unless it calls setsid, and then it is still below by parent
/// until it is re-parented). A racy snapshot, like any listing of /proc.
std::vector<pid_t> ProcessTree(pid_t root);

/// Whether `pid` is in ProcessTree(root) now: a pid a process claimed is still
/// its tree's, not a later process that got the number.
bool InProcessTree(pid_t pid, pid_t root);

}  // namespace dflash
