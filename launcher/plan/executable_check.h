// `check` and `run` before anything is spawned: is each role's command there,
// and executable, for the PATH and cwd that role's processes will have?
#pragma once

#include <vector>

#include "launcher/config/config_error.h"
#include "launcher/plan/plan.h"

namespace dflash {

/// One error per role whose command[0] is not found (in the role's PATH: its
/// env's PATH, else the launcher's) or not executable, at the command key's
/// file:line:col. An error, not a warning: the run would fail there anyway,
/// after starting (and then stopping) every other process, GPUs and all.
std::vector<ConfigError> CheckCommands(const RunConfig& config, const EnvList& launcher_env);

}  // namespace dflash
