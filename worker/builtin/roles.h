// The subcommands of dflash-builtin: the two roles and the small tools the
// tests use. Each returns the process exit code (docs/builtin.md):
// 0 ok, 1 runtime failure, 64 usage or no [model] contract in the
// environment, 65 a frame (or the shared weights) violates the contract.
#pragma once

#include <cstdint>
#include <string>

namespace dflash::builtin {

struct BuiltinOptions {
  // target
  int64_t samples = 100;   // frames per target (DFLASH_SAMPLES)
  int spool_max = 16;      // backpressure: pause while ready/ holds this many (DFLASH_SPOOL_MAX)
  // drafter
  int64_t steps = 0;       // stop after this many steps; 0 = until the spool ends (DFLASH_STEPS)
  double lr = 3e-3;        // AdamW learning rate (DFLASH_LR), as the Python reference
  int64_t pace_ms = 0;     // sleep per step while holding the frame (tests: a slow step) (DFLASH_PACE_MS)
  int threads = 1;         // at::set_num_threads (DFLASH_TORCH_THREADS): 8 processes share few cores
  // drafter checkpoints in $DFLASH_CHECKPOINT_DIR/<process> (docs/checkpoints.md)
  int64_t checkpoint_every = 0;  // every N steps and at the end; 0: none, frames straight to done/ (DFLASH_CHECKPOINT_EVERY)
  int checkpoint_keep = 3;       // the last K committed stay (DFLASH_CHECKPOINT_KEEP)
  int64_t checkpoint_pause_ms = 0;  // sleep between a checkpoint's write and its commit (tests: a kill mid-write)
  bool checkpoint_adopt = false;  // may start from another run's checkpoint (DFLASH_CHECKPOINT_ADOPT=1, docs/checkpoints.md)
  // tools
  std::string out, weights, frame;
  int64_t rank = 0, seq = 0;
};

int RunTarget(const BuiltinOptions& o);
int RunDrafter(const BuiltinOptions& o);
/// The target's (seeded) weights as safetensors.
int ExportTarget(const BuiltinOptions& o);
/// The drafter's seeded init as safetensors (the same as the Python reference's).
int InitDrafter(const BuiltinOptions& o);
/// One frame exactly as target `rank` publishes sample `seq`.
int Tap(const BuiltinOptions& o);
/// The loss of the first step(s) on one frame from given weights, as JSON.
int Loss(const BuiltinOptions& o);
/// The consumer's contract check of one frame file.
int CheckFrameFile(const BuiltinOptions& o);

}  // namespace dflash::builtin
