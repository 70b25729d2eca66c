// What a `run --resume` resumes, said before anything is spawned: each role's newest committed checkpoint and the
// spool's frames (issue #59: a resume a team can watch). Read from the disk only: the checkpoint dirs' names
// (step-N is committed: its rename was the commit, docs/checkpoints.md) and the spool's count.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "launcher/plan/plan.h"

namespace dflash {

/// The newest committed checkpoint directly under `dir` (`step-<10 digits>[.k]`, the Python Checkpoint's and the
/// builtin drafter's names): its path and step; step -1 when there is none (or no such dir).
struct CheckpointFound {
  std::string path;
  int64_t step = -1;
};
CheckpointFound NewestCheckpoint(const std::string& dir);

/// The console's first lines of a resumed run (none for a fresh one): "resuming run ID (attempts from attempt_N)",
/// then a line per role (or per process, for a role whose processes checkpoint apart) that has a checkpoint dir,
/// and one for the spool's frames when it is there.
std::vector<std::string> ResumeSaid(const Plan& plan);

}  // namespace dflash
