// The builtin drafter's checkpoints (issue #45): its parameters and AdamW state (one safetensors file, the same
// format as its weights: `dflash-builtin loss --weights` and Python's safetensors read it), the step, and the
// spool consumer's position, in a CheckpointDir; the frames it acknowledged commit with each checkpoint
// (spool_commit.h), so every frame enters the final model exactly once. Each records whose it is
// (checkpoint_identity.h): a restore takes only this run's, and only one that covers every frame done/ says a
// checkpoint of this dir committed; anything else is refused (exit 78), never a silent fresh start or skipped
// frames. docs/checkpoints.md.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "worker/builtin/checkpoint_dir.h"
#include "worker/builtin/checkpoint_identity.h"
#include "worker/builtin/model.h"
#include "spool/spool.h"

namespace dflash::builtin {

struct CheckpointOptions {
  int64_t every = 0;     // a checkpoint every N steps, and one at the end; 0: none (DFLASH_CHECKPOINT_EVERY)
  int keep = 3;          // the last K committed stay (DFLASH_CHECKPOINT_KEEP)
  int64_t pause_ms = 0;  // sleep between a checkpoint's write and its commit (tests: a kill mid-write)
  bool adopt = false;    // start from another run's (or an identity-less) checkpoint (DFLASH_CHECKPOINT_ADOPT=1)
};

enum class RestoreResult {
  kOk,
  kFailed,   // an I/O error: a restart may do better
  kRefused,  // no checkpoint here can be restored exactly, and a restart would find the same: exit 78
};

class DrafterCheckpoints {
 public:
  /// The file a checkpoint holds.
  static constexpr char kFile[] = "drafter.safetensors";

  /// `me`: this process's identity, recorded in every checkpoint it writes.
  DrafterCheckpoints(std::string dir, const CheckpointOptions& o, CheckpointIdentity me);

  /// Removes a killed save's leftovers, loads the newest committed checkpoint into `drafter` (none: it stays as
  /// built) and puts `consumer` back at its position: the frames that checkpoint covers are committed, the frames
  /// acknowledged after it are delivered again first. `*step`: the step to go on from (0: none); `*path`: the
  /// checkpoint loaded ("" if none); `*notes`: what the log should say (a damaged one set aside, an adoption).
  /// kRefused (`*err` names the checkpoint and what to do): another run's without the opt-in, another [model],
  /// not a drafter checkpoint, or frames in done/ committed by a checkpoint it would not restore (removed, damaged,
  /// newer). A damaged newest that committed no frames is set aside and the one before it tried.
  RestoreResult Restore(Drafter* drafter, spool::SpoolConsumer* consumer, int64_t* step, std::string* path,
                        std::vector<std::string>* notes, std::string* err);

  bool Due(int64_t steps_done) const { return o_.every > 0 && steps_done % o_.every == 0; }
  /// The step of the last checkpoint restored or committed (-1: none).
  int64_t last_step() const { return last_step_; }
  int written() const { return written_; }
  const std::string& dir() const { return dir_.dir(); }
  double blocked_s() const { return blocked_s_; }

  /// A checkpoint of `steps_done` steps (the drafter, its optimizer, the consumer's position), committed; then
  /// the consumer's frames before that position move to done/ naming it, and the oldest beyond `keep` go.
  /// `*path`: the committed checkpoint; `*committed`: the frames it committed.
  bool Save(const Drafter& drafter, spool::SpoolConsumer* consumer, int64_t steps_done, std::string* path,
            int* committed, std::string* err);

 private:
  /// One checkpoint, `ck`, into `drafter` and `consumer`, if it is this run's and covers what done/ says
  /// (`commits`). kFailed with `*damaged` set: it cannot be read (the caller decides between set-aside and refusal).
  RestoreResult RestoreFrom(const std::string& ck, const std::map<std::string, std::vector<std::string>>& commits,
                            Drafter* drafter, spool::SpoolConsumer* consumer, int64_t* step,
                            std::vector<std::string>* notes, bool* damaged, std::string* err);

  CheckpointDir dir_;
  CheckpointOptions o_;
  CheckpointIdentity me_;
  int64_t last_step_ = -1;
  int written_ = 0;
  double blocked_s_ = 0;
};

}  // namespace dflash::builtin
