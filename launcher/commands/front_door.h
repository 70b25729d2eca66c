// What every command does before it acts: read the config, check that its commands run, place this launcher
// among the nodes, plan, and check the plan against this host. Each step returns a Status (common/status.h) and
// prints nothing; the command says it once with Say and exits with its code (docs/exit-codes.md).
#pragma once

#include <string>

#include "common/status.h"
#include "launcher/commands/commands.h"
#include "launcher/config/config.h"
#include "launcher/plan/plan.h"

namespace dflash {

/// Prints `s`'s message (if any) to stderr; returns its exit code (0 for ok).
int Say(const Status& s);

/// The launcher's environment as a list (for gate keys and the children's base env).
EnvList EnvironmentList(char** env);

/// Loads and validates `path`; every error at its file:line:col (exit 2).
Status LoadConfigFile(const std::string& path, RunConfig* config);
/// `check` and `run` (not the cache tools): every role's command exists and is executable for its PATH and cwd
/// (launcher/plan/executable_check.h).
Status CommandsRun(const RunConfig& config, char** env);
/// Builtin roles run bin_dir/dflash-builtin, which the pip wheel leaves out (docs/wheel.md). `run` refuses such a
/// config before spawning anything; for `check` (warn_only) the message is a warning: the rest of the plan is valid.
Status BuiltinInstalled(const RunConfig& config, const std::string& bin_dir, bool warn_only);
/// This host's GPUs (NVML) and the roles' CUDA/Triton and payload-hook probes, for the plan.
void AddHostFacts(const RunConfig& config, PlanOptions* po);
/// Loads the config and builds its plan for `run_id` on one node (seed, cache).
Status LoadPlan(const std::string& config, const std::string& run_id, const std::string& bin_dir, char** env,
                Plan* plan);
/// Places this launcher among the nodes (flags, scheduler env, [run]) and builds its plan. `run_id`: the flag;
/// empty: the scheduler's job id, else `fallback_run_id` (which may be empty: then several nodes need --run-id).
/// Exit codes: 64 (flags, env), 2 (config).
Status PlanThisNode(const RunConfig& config, const NodeFlags& flags, const std::string& run_id,
                    const std::string& fallback_run_id, const std::string& bin_dir, char** env, Plan* plan);
/// `check` and `run`: this node's processes fit this host's execve and fork limits (launcher/plan/host_limits.h).
Status HostLimitsFit(const Plan& plan, char** env);
/// A run id is a directory name: [A-Za-z0-9._-], 1 to 128, not "." or "..".
bool ValidRunId(const std::string& id);

}  // namespace dflash
