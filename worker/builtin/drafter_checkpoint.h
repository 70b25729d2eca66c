// The builtin drafter's checkpoints (issue #45): its parameters and AdamW state (one safetensors file, the same
// format as its weights: `dflash-builtin loss --weights` and Python's safetensors read it), the step, and the
// spool consumer's position, in a CheckpointDir; the frames it acknowledged commit with each checkpoint
// (spool_commit.h), so every frame enters the final model exactly once. docs/checkpoints.md.
#pragma once

#include <cstdint>
#include <string>

#include "worker/builtin/checkpoint_dir.h"
#include "worker/builtin/model.h"
#include "worker/builtin/spool.h"

namespace dflash::builtin {

struct CheckpointOptions {
  int64_t every = 0;     // a checkpoint every N steps, and one at the end; 0: none (DFLASH_CHECKPOINT_EVERY)
  int keep = 3;          // the last K committed stay (DFLASH_CHECKPOINT_KEEP)
  int64_t pause_ms = 0;  // sleep between a checkpoint's write and its commit (tests: a kill mid-write)
};

class DrafterCheckpoints {
 public:
  /// The file a checkpoint holds.
  static constexpr char kFile[] = "drafter.safetensors";

  DrafterCheckpoints(std::string dir, const CheckpointOptions& o);

  /// Removes a killed save's leftovers, loads the newest committed checkpoint into `drafter` (none: it stays as
  /// built) and puts `consumer` back at its position: the frames that checkpoint covers are committed, the frames
  /// acknowledged after it are delivered again first. `*step`: the step to go on from (0: none); `*path`: the
  /// checkpoint loaded ("" if none).
  bool Restore(Drafter* drafter, spool::SpoolConsumer* consumer, int64_t* step, std::string* path, std::string* err);

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
  CheckpointDir dir_;
  CheckpointOptions o_;
  int64_t last_step_ = -1;
  int written_ = 0;
  double blocked_s_ = 0;
};

}  // namespace dflash::builtin
