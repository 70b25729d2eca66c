// The resolved plan: one entry per process (role, device) with everything it
// will get. `dflash-launch check` prints it; the supervisor spawns from it.
#pragma once

#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "launcher/config.h"
#include "launcher/gate_key_files.h"

namespace dflash {

using EnvList = std::vector<std::pair<std::string, std::string>>;

struct ProcessPlan {
  std::string name;  // "drafter:1"
  std::string role;
  size_t role_index = 0;
  int role_rank = 0;
  int role_world_size = 0;
  int rank = 0;
  int gpu = -1;                      // the one GPU it sees as cuda:0; -1 for CPU processes
  std::vector<std::string> command;  // the payload (for a builtin: dflash-builtin <role>)
  std::string gate_key;              // empty if ungated
  /// The warm-up of a role in gate mode "warmup" ("drafter:warmup"): compiles
  /// under the gate in a world of one before the role's processes start.
  bool warmup = false;
};

struct PlanOptions {
  std::string run_id = "<run_id>";   // `check` shows placeholders; `run` makes a real one
  std::string bin_dir;               // where dflash-worker and dflash-builtin are
  /// torch's version as the role's processes will see it (part of the gate key).
  std::function<std::string(const RoleSpec&)> torch_version;
  /// The launcher's environment: TORCHINDUCTOR_* & co. in it change the gate key.
  EnvList launcher_env;
};

struct Plan {
  RunConfig config;
  std::string run_id;
  std::string run_dir;  // <log_dir>/<run_id>
  std::string bin_dir;
  std::vector<std::string> role_torch_version;  // per role
  std::vector<std::vector<KeyFile>> role_key_files;  // per role: the files in its derived gate key
  std::vector<ProcessPlan> processes;
  /// One per role in gate mode "warmup" (RoleSpec::warmup_gated), run before
  /// that role's processes start. Not part of the world: no rank of its own.
  std::vector<ProcessPlan> warmups;

  const RoleSpec& RoleOf(const ProcessPlan& p) const { return config.roles[p.role_index]; }
  /// <run_dir>/attempt_<k>/<role>-<rank>.<suffix>
  std::string AttemptPath(const ProcessPlan& p, int attempt, const std::string& suffix) const;
  /// The variables dflash-launch sets for this process on this attempt, in a
  /// stable order; the rest of the environment is the launcher's own.
  EnvList ProcessEnv(const ProcessPlan& p, int attempt) const;
  /// Hidden-state frames of this run: <run.spool_dir>/<run_id> (DFLASH_SPOOL_DIR).
  std::string SpoolDir() const;
  /// Processes that publish frames there: those of builtin target roles (DFLASH_SPOOL_PRODUCERS).
  int SpoolProducers() const;
  /// Whether the process needs dflash-worker in between: for the gate, or a
  /// readiness only a host can observe (log lines, a file). Otherwise the
  /// supervisor executes the payload itself and sees its readiness (none,
  /// notify, exit) and its exit status first-hand: one exec less per process.
  bool NeedsWorker(const ProcessPlan& p) const;
  /// What the supervisor executes: dflash-worker with the gate/ready options
  /// and then the payload, or the payload alone (see NeedsWorker).
  std::vector<std::string> ExecArgv(const ProcessPlan& p) const;
};

Plan BuildPlan(const RunConfig& config, const PlanOptions& options);

/// The default gate key: "<role>-<16 hex>" over the role name, the [model]
/// contract, torch's version, the command, the content of the files it runs
/// (`files`: the script and gate.key_files) and every TORCHINDUCTOR_*,
/// TORCH_COMPILE_*, TORCHDYNAMO_* and TRITON_* variable (launcher env, then role env).
std::string DeriveGateKey(const RoleSpec& role, const ModelSpec& model, const std::string& torch_version,
                          const EnvList& launcher_env, const std::vector<KeyFile>& files = {});

/// "1,2000,25600"
std::string JoinInts(const std::vector<int64_t>& v, const char* sep = ",");

}  // namespace dflash
