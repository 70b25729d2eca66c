// Shared between config_load.cc, config_validate.cc and model_check.cc; not part of the API.
#pragma once

#include <toml++/toml.h>

#include <initializer_list>
#include <string>
#include <string_view>
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

/// The node at `path` under `root` (nullptr: absent, or a part on the way is not a table).
const toml::node* NodeAt(const toml::table& root, std::initializer_list<std::string_view> path);
/// Where `path` is written; else its enclosing table; else the top of `file`.
SourcePos PosIn(const toml::table& root, std::initializer_list<std::string_view> path, const std::string& file);

/// [model]'s shape contract across its keys (model_check.cc); fills the derived tapped_layers and kv_heads.
void CheckModel(const toml::table& root, RunConfig* cfg, std::vector<ConfigError>* errors);

}  // namespace dflash
