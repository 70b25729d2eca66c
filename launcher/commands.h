// The subcommands of dflash-launch, each a function from options to an exit code.
#pragma once

#include <string>

#include "common/duration.h"
#include "launcher/config.h"
#include "launcher/console.h"
#include "launcher/plan.h"

namespace dflash {

struct CheckOptions {
  std::string config;
  bool json = false;
  std::string bin_dir;
};

struct RunOptions {
  std::string config;
  std::string run_id;  // empty: <name>-<date>-<time>-<pid>
  std::string bin_dir;
  ColorMode color = ColorMode::kAuto;
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
  Millis timeout{std::chrono::hours(1)};  // longest wait for the gate
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

/// "cuda" if any role runs on GPUs, else "cpu": what the cache's kernels are for.
std::string DeviceKind(const RunConfig& config);
/// The torch version the cache is built with: that of the (first) gated role.
std::string CacheTorchVersion(const Plan& plan);

/// Loads the config (errors -> stderr) and builds its plan for `run_id`.
bool LoadPlanOrReport(const std::string& config, const std::string& run_id, const std::string& bin_dir, char** env,
                      Plan* plan);

/// Loads and validates `path`; prints every error to stderr. False: exit 2.
bool LoadConfigOrReport(const std::string& path, RunConfig* config);
/// `check` and `run` (not the cache tools): every role's command exists and is
/// executable for its PATH and cwd (launcher/command_check.h); else prints the errors.
bool CommandsRunOrReport(const RunConfig& config, char** env);

/// The launcher's environment as a list (for gate keys and the children's base env).
EnvList EnvironmentList(char** env);

}  // namespace dflash
