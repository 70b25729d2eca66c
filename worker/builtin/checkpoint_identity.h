// Whose a checkpoint is (issue #55): the run, role, process, world size, [model] and spool that wrote it, kept in
// the checkpoint itself, so a restore takes only a checkpoint of this run. The same keys as dflash_launch.Checkpoint
// writes into identity.json (docs/checkpoints.md, "Identity"); here they are string values of the safetensors
// metadata, `model` as compact JSON text.
#pragma once

#include <cstdint>
#include <map>
#include <string>

namespace dflash::builtin {

struct CheckpointIdentity {
  std::string run_id;   // DFLASH_RUN_ID ("" outside dflash-launch)
  std::string role;     // ROLE_NAME
  std::string process;  // DFLASH_PROCESS
  int64_t world_size = 1;  // the ranks that wrote it: 1, each builtin drafter checkpoints on its own
  std::map<std::string, std::string> model;  // the [model] variables set (DFLASH_HIDDEN_SHAPE, ...): name -> value
  std::string spool;    // the spool dir it consumed (DFLASH_SPOOL_DIR: <[run] spool_dir>/<run id>)

  /// This process's, from the environment dflash-launch gives it.
  static CheckpointIdentity FromEnv(const std::string& spool);

  /// Adds the identity's keys to a checkpoint's metadata.
  void AddTo(std::map<std::string, std::string>* meta) const;

  enum class Read { kOk, kAbsent, kMalformed };
  /// The identity a checkpoint's metadata holds. kAbsent: none (written before checkpoints recorded one);
  /// kMalformed: some keys, not all readable (`*err` says which).
  static Read From(const std::map<std::string, std::string>& meta, CheckpointIdentity* out, std::string* err);
};

/// What a restore may do with a checkpoint, given its identity and this process's.
struct IdentityCheck {
  enum Verdict { kSameRun, kAdopt, kRefuse } verdict = kRefuse;
  /// The checkpoint consumed this process's spool: its position applies (kSameRun always; kAdopt when the spool
  /// is the same).
  bool same_spool = false;
  std::string why;  // kRefuse: the refusal, with what to do; kAdopt: what is taken from it
};

/// `theirs` null: the checkpoint has no identity. `adopt`: DFLASH_CHECKPOINT_ADOPT=1, the explicit opt-in to
/// start from another run's (or an identity-less) checkpoint. Another [model] is refused even then.
IdentityCheck JudgeIdentity(const CheckpointIdentity& mine, const CheckpointIdentity* theirs, bool adopt,
                            const std::string& path);

}  // namespace dflash::builtin
