// Nothing of a run outlives it: the run's cgroup v2 sub-tree (where the
// launcher may make one) and dflash-guardian, which kills the run's processes
// if the supervisor itself is SIGKILLed. The supervisor owns one RunGuard.
#pragma once

#include "common/private_files.h"

#include <sys/types.h>

#include <cstdint>
#include <string>
#include <vector>

#include "common/fd.h"
#include "launcher/supervise/cgroup_tree.h"

namespace dflash {

class RunGuard {
 public:
  struct Options {
    std::string token;    ///< DFLASH_RUN_TOKEN of this run
    std::string bin_dir;  ///< where dflash-guardian is
    std::string log_path; ///< the guardian's stderr (<run_dir>/guardian.log)
    FileMode log_mode;    ///< how that file is made (common/private_files.h)
    CgroupMode mode = CgroupMode::kAuto;
    std::vector<std::string> env;  ///< the guardian's environment
  };

  RunGuard() = default;
  RunGuard(const RunGuard&) = delete;
  RunGuard& operator=(const RunGuard&) = delete;
  ~RunGuard();

  /// Makes the cgroup (per mode) and starts the guardian. False only when the
  /// run must not go on (mode = require and no cgroup); `notes` says what each
  /// part got ("cgroup v2: /sys/fs/cgroup/...", "no cgroup: ...", "guardian pid N").
  bool Start(const Options& o, std::string* err, std::vector<std::string>* notes);

  bool cgroup() const { return cgroup_.active(); }
  const std::string& cgroup_dir() const { return cgroup_.dir(); }
  pid_t guardian_pid() const { return guardian_pid_; }
  /// The guardian exited before the run did (reaped by the supervisor's reaper).
  void GuardianReaped() {
    guardian_pid_ = -1;
    guardian_pipe_.reset();
  }
  /// After GuardianReaped: a new guardian for the same run, told everything
  /// the first one knew (the cgroup, every session, the first one's start
  /// time, so processes started before it are still its to kill). False with
  /// the reason when it cannot be started.
  bool Restart(std::string* err);

  /// Before spawning attempt `attempt` of process `index`: its fresh leaf's
  /// cgroup.procs for SpawnOptions::cgroup_procs_fd (invalid without cgroups).
  UniqueFd Leaf(size_t index, int attempt, std::string* err);
  /// After it was spawned in its own session `sid`: the guardian learns it.
  void Spawned(pid_t sid);
  /// After it ended: SIGKILLs what is left in its leaf (its whole tree),
  /// removes the leaf; returns its memory.peak (-1 without memory accounting).
  int64_t Ended(size_t index, int attempt);
  /// Every process still in the run's cgroup: SIGKILL (no-op without cgroups).
  void KillAll();
  /// The end of the run: kill and remove the cgroup, tell the guardian the run
  /// ended normally, close its pipe and reap it (it sweeps once more and exits).
  void Finish();

 private:
  void Tell(const std::string& line);
  /// Everything a guardian started now must know, one line each.
  std::string KnownLines() const;
  /// `known` is written into its pipe before it is spawned (what fits).
  bool SpawnGuardian(const std::string& known, std::string* err);
  /// Writes what fits without blocking; returns how many bytes.
  static size_t PreloadPipe(int fd, const std::string& bytes);

  Options options_;
  std::vector<pid_t> sessions_;   // every session told, for a new guardian
  uint64_t first_start_ = 0;      // the first guardian's start time (clock ticks)
  RunCgroup cgroup_;
  pid_t guardian_pid_ = -1;
  UniqueFd guardian_pipe_;  // write end; O_CLOEXEC, so no child ever holds it
};

}  // namespace dflash
