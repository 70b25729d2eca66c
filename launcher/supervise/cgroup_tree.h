// A cgroup v2 sub-tree for one run: <own cgroup>/dflash-<token>/<process>.a<attempt>.
// cgroup.kill ends a whole process tree at once, setsid and double-fork included,
// and memory.peak says how much a process tree used. Only where the launcher
// may create cgroups (root, a delegated sub-tree); docs/design.md has the matrix.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <string>

#include "common/fd.h"

namespace dflash {

enum class CgroupMode {
  kAuto,     ///< use cgroups if a sub-tree can be made, else the fallback (default)
  kOff,      ///< never (DFLASH_CGROUP=off)
  kRequire,  ///< fail the run if no sub-tree can be made (DFLASH_CGROUP=require)
};

/// DFLASH_CGROUP: "off", "require", "auto" or unset (auto).
bool ParseCgroupMode(const char* value, CgroupMode* out, std::string* err);

/// Where this process's own cgroup v2 directory is (from /proc/self/cgroup's
/// "0::" line and the cgroup2 mount in /proc/self/mountinfo); false if there
/// is no cgroup2 mount or the process is not in the v2 hierarchy.
bool OwnCgroupDir(std::string* dir, std::string* err);
/// The same for process `pid` (its /proc/<pid>/cgroup, seen through our mounts).
bool ProcessCgroupDir(pid_t pid, std::string* dir, std::string* err);

class RunCgroup {
 public:
  RunCgroup() = default;
  RunCgroup(const RunCgroup&) = delete;
  RunCgroup& operator=(const RunCgroup&) = delete;
  ~RunCgroup();

  /// mkdir <own>/dflash-<token> and enable the memory controller below it where
  /// the kernel lets us. False with `err` if no sub-tree can be made here.
  bool Create(const std::string& token, std::string* err);
  bool active() const { return !dir_.empty(); }
  const std::string& dir() const { return dir_; }
  bool has_memory() const { return memory_; }

  /// A fresh leaf for one attempt of one process; returns its cgroup.procs
  /// opened O_WRONLY|O_CLOEXEC (the child writes "0" into it before exec:
  /// SpawnOptions::cgroup_procs_fd), or an invalid fd with `err`.
  UniqueFd MakeLeaf(const std::string& leaf, std::string* err);
  std::string LeafDir(const std::string& leaf) const { return dir_ + "/" + leaf; }

  /// cgroup.kill: SIGKILL every process in `dir` and below (Linux 5.14+).
  /// False if the kernel has no cgroup.kill (then the caller kills by pid).
  static bool Kill(const std::string& dir);
  /// memory.peak of `dir` in bytes, or -1 where there is none.
  static int64_t MemoryPeak(const std::string& dir);
  /// Waits up to `timeout_ms` until `dir` holds no process (cgroup.events: populated 0).
  static bool WaitEmpty(const std::string& dir, int timeout_ms);

  /// rmdir of `dir` and every cgroup below it, deepest first (busy ones stay).
  static void RemoveTree(const std::string& dir);

  /// Kills the leaf's processes, waits briefly until it is empty and removes it.
  void RemoveLeaf(const std::string& leaf);
  /// Kills everything left in the run's tree and removes it.
  void Destroy();

 private:
  std::string dir_;
  bool memory_ = false;
};

/// The leaf name for process `index` (0-based, in plan order), attempt `attempt`.
std::string LeafName(size_t index, int attempt);

}  // namespace dflash
