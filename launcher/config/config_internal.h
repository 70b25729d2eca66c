// Shared between config_load.cc and config_validate.cc; not part of the API.
#pragma once

#include <toml++/toml.h>

#include <string>
#include <vector>

#include "launcher/config/config.h"
#include "launcher/config/toml_reader.h"

namespace dflash {

bool ValidEnvName(const std::string& name);
/// Variables dflash-launch sets per process; a role's env may not override them.
bool IsReservedEnv(const std::string& name);
std::string ReservedEnvHint(const std::string& name);

/// Restart budgets that contradict themselves or can never run out.
void CheckRestartBudget(TableReader& r, const std::string& policy, const RestartSpec& rs);

/// Cross-field rules over the whole config (GPUs, names, shape contract, cache dir).
void ValidateConfig(const toml::table& root, RunConfig* cfg, std::vector<ConfigError>* errors);

}  // namespace dflash
