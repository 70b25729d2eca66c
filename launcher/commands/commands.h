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
  bool no_dedup = false; // --no-dedup: every console line as each process says it ([run] console_dedup = false)
  bool resume = false; // --resume: continue the run id's run dir (new attempt dirs, events appended)
  NodeFlags nodes;
};

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
/// The first gated role's GPU identity (RolePlan::gpu_identity): what archives record and imports check.
std::string CacheGpuIdentity(const Plan& plan);
/// The first gated role's CPU identity (RolePlan::cpu_identity; else the first role's): archives record it and
/// imports refuse another (cachelock/cache_archive.h).
std::string CacheCpuIdentity(const Plan& plan);

}  // namespace dflash
