// The subcommands of dflash-launch, each a function from options to an exit code.
#pragma once

#include <string>

#include "common/duration.h"
#include "launcher/config/config.h"
#include "launcher/console/console.h"
#include "launcher/plan/node_env.h"
#include "launcher/plan/plan.h"

namespace dflash {

struct CheckOptions {
  std::string config;
  bool json = false;
  std::string bin_dir;
  NodeFlags nodes;
  std::string run_id;  // empty: the scheduler's, else the placeholder <run_id>
};

struct RunOptions {
  std::string config;
  std::string run_id;  // empty: the scheduler's job id (several nodes), else <name>-<date>-<time>-<pid>
  std::string bin_dir;
  ColorMode color = ColorMode::kAuto;
  bool plain = false;  // --plain: no live view even on a terminal
  bool resume = false; // --resume: continue the run id's run dir (new attempt dirs, events appended)
  NodeFlags nodes;
};

/// Places this launcher among the nodes (flags, scheduler env, [run]) and
/// builds its plan. `run_id`: the flag; empty: the scheduler's job id, else
/// `fallback_run_id` (which may be empty: then several nodes need --run-id).
/// Errors go to stderr; returns 0, or the exit code (64: flags/env, 2: config).
int PlanThisNode(const RunConfig& config, const NodeFlags& flags, const std::string& run_id,
                 const std::string& fallback_run_id, const std::string& bin_dir, char** env, Plan* plan);

/// A run id is a directory name: [A-Za-z0-9._-], 1 to 128, not "." or "..".
bool ValidRunId(const std::string& id);

/// Runs the plan under the supervisor; returns the run's exit code.
int RunRun(const RunOptions& opts, char** env);

/// Loads the config (errors -> stderr, exit 2) and prints the plan.
int RunCheck(const CheckOptions& opts, char** env);

struct CacheOptions {
  std::string action;  // status | export | import | clear
  std::string config;
  std::string file;    // export / import
  std::string key;     // clear --key
  bool json = false;   // status --json
  bool force = false;  // import --force
  bool trust = false;  // import --trust: an archive not signed with the user's key (cachelock/archive_key.h)
  Millis timeout{std::chrono::minutes(30)};  // longest wait for the gate (main sets kDefaultGateTimeout)
  std::string bin_dir;
};

/// `dflash-launch cache ...`: status, export, import, clear of the config's cache.
int RunCache(const CacheOptions& opts, char** env);

struct SeedOptions {
  std::string config;
  std::string role;     // empty: every gated role
  bool verify = false;
  bool force = false;
  std::string bin_dir;
};

/// `dflash-launch seed`: pre-compile each gated role's graphs into the cache.
int RunSeed(const SeedOptions& opts, char** env);

struct CtlOptions {
  std::string run;     // RUN_ID or RUN_DIR; empty: the one live run of this user on this host
  std::string action;  // status | restart | stop | start | signal | logs
  std::string target;  // role, role:rank or all
  std::string signal;  // signal: SIGUSR1, USR1
  bool json = false;   // status --json
  bool follow = false; // logs -f
  int timeout_ms = 10000;
};

/// `dflash-launch ctl ...`: ask a live run (its control socket, docs/control.md).
int RunCtl(const CtlOptions& opts);
/// `dflash-launch ps`: the live runs of this user on this host.
int RunPs(bool json);

/// "cuda" if any role runs on GPUs, else "cpu": what the cache's kernels are for.
std::string DeviceKind(const RunConfig& config);
/// The torch version the cache is built with: that of the (first) gated role.
std::string CacheTorchVersion(const Plan& plan);
/// The first gated role's GPU identity (Plan::role_gpu_identity): what archives record and imports check.
std::string CacheGpuIdentity(const Plan& plan);

/// Loads the config (errors -> stderr) and builds its plan for `run_id`.
/// Adds this host's GPUs (NVML) and the roles' CUDA/Triton probe to `po`.
void AddHostFacts(const RunConfig& config, PlanOptions* po);
bool LoadPlanOrReport(const std::string& config, const std::string& run_id, const std::string& bin_dir, char** env,
                      Plan* plan);

/// Loads and validates `path`; prints every error to stderr. False: exit 2.
bool LoadConfigOrReport(const std::string& path, RunConfig* config);
/// Builtin roles run bin_dir/dflash-builtin, which the pip wheel leaves out (docs/wheel.md). `run` refuses such a
/// config before spawning anything (returns false); `check` only warns (warn_only), the rest of the plan is valid.
bool BuiltinInstalledOrReport(const RunConfig& config, const std::string& bin_dir, bool warn_only);
/// `check` and `run` (not the cache tools): every role's command exists and is
/// executable for its PATH and cwd (launcher/plan/executable_check.h); else prints the errors.
bool CommandsRunOrReport(const RunConfig& config, char** env);
/// `check` and `run`: this node's processes fit this host's execve and fork
/// limits (launcher/plan/host_limits.h); else prints the errors.
bool HostLimitsOrReport(const Plan& plan, char** env);

/// The launcher's environment as a list (for gate keys and the children's base env).
EnvList EnvironmentList(char** env);

}  // namespace dflash
