// One process's checkpoint directory, the way dflash_launch.Checkpoint keeps one (docs/checkpoints.md), without
// LibTorch: what is written into a checkpoint is the caller's (a callback). A checkpoint is written to
// <dir>/.tmp-step-<N:010d>/, its files fsynced, and becomes <dir>/step-<N:010d>/ by one rename, the directory
// fsynced after: that rename is the commit. A kill at any moment leaves the whole checkpoint or none; Open removes
// the .tmp-* a kill left, and the last `keep` committed ones stay.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <utility>
#include <vector>

namespace dflash::builtin {

class CheckpointDir {
 public:
  /// `file`: the one file a committed checkpoint must hold (a step-N without it is not one).
  CheckpointDir(std::string dir, int keep, std::string file);

  /// mkdir -p (0700, refused if another user's or writable by others), then removes the .tmp-* leftovers of a
  /// save a kill interrupted. `*removed`: how many.
  bool Open(int* removed, std::string* err);

  /// [(step, path)] of the committed checkpoints, oldest first.
  bool Committed(std::vector<std::pair<int64_t, std::string>>* out, std::string* err) const;

  /// Checkpoint `step`: `write(tmp_dir, err)` fills <dir>/.tmp-step-N/ (and fsyncs what it writes); then the
  /// rename to <dir>/step-N/ and the fsync of <dir>. `*path`: the committed checkpoint. `before_commit` (may be
  /// empty) runs between the write and the rename (a test's pause, to be killed mid-write).
  bool Save(int64_t step, const std::function<bool(const std::string&, std::string*)>& write, std::string* path,
            std::string* err, const std::function<void()>& before_commit = {});

  /// Removes the oldest committed checkpoints beyond `keep`.
  bool Prune(std::string* err);

  /// A damaged checkpoint (`path`, committed) out of the committed names, kept for a look: renamed to
  /// <dir>/damaged-<name> (".2", ".3", ... if taken), the dir fsynced. A later save of its step then neither
  /// collides with it nor is it tried again. `*aside`: where it went.
  bool SetAside(const std::string& path, std::string* aside, std::string* err);

  /// The checkpoints that done/ records name (`commits`: CommitsInto of this dir) which a restore of `restored`
  /// (its step and path; step -1 and "" for none) does not cover: a greater step, or its step under another name,
  /// there or not. Their frames are in done/, so they would be skipped, and a later save could take the name.
  /// Smaller steps are not listed: `keep` prunes old checkpoints, their frames are in the restored one.
  static std::vector<std::string> Uncovered(const std::map<std::string, std::vector<std::string>>& commits,
                                            int64_t restored_step, const std::string& restored);

  const std::string& dir() const { return dir_; }
  const std::string& file() const { return file_; }

  /// "step-<N:010d>".
  static std::string StepName(int64_t step);

 private:
  std::string dir_, file_;
  int keep_;
};

}  // namespace dflash::builtin
