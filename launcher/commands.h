// The subcommands of dflash-launch, each a function from options to an exit code.
#pragma once

#include <string>

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

/// Loads and validates `path`; prints every error to stderr. False: exit 2.
bool LoadConfigOrReport(const std::string& path, RunConfig* config);

/// The launcher's environment as a list (for gate keys and the children's base env).
EnvList EnvironmentList(char** env);

}  // namespace dflash
