// Shared by the config room's .cc files: the loader's table readers (config_load.cc calls them in the order
// their errors are reported) and the helpers they share; not part of the API.
#pragma once

#include <toml++/toml.h>

#include <initializer_list>
#include <string>
#include <string_view>
#include <vector>

#include "launcher/config/config.h"
#include "launcher/config/toml_reader.h"

namespace dflash {

/// The largest value an int key takes.
inline constexpr long long kIntMax = 2147483647;

/// A run, gate key or role name: letters, digits, '-' and '_' (1 to 128); with `allow_upper_dot` also upper case
/// and '.', else starting with a lower-case letter (config_load.cc).
bool ValidName(std::string_view s, bool allow_upper_dot);
/// Relative paths are relative to the config file; "~/" is $HOME (config_load.cc).
std::string ResolvePath(const std::string& p, const std::string& base_dir);

// ---- the table readers: each reads its keys into the struct and adds its errors ----

/// [run] (run_table.cc); `t` nullptr: no [run], every key its default.
void ReadRun(const toml::table* t, const std::string& file, const std::string& base_dir, RunSpec* run,
             std::vector<ConfigError>* errors);
/// [model]'s keys, one by one (model_table.cc).
void ReadModel(const toml::table& t, ModelSpec* m, std::vector<ConfigError>* errors);
/// One [[role]], the `index`th (role_table.cc).
void ReadRole(const toml::table& t, size_t index, const std::string& base_dir, RoleSpec* role,
              std::vector<ConfigError>* errors);

// A [[role]]'s key families (role_placement.cc, role_env.cc). `r` reads the role's table.

/// devices or cpu (exactly one), and nodes.
void ReadPlacement(TableReader& r, const toml::table& t, RoleSpec* role);
/// ports = ["http", "metrics"]: names [a-z][a-z0-9_]*, each once.
void ReadPorts(TableReader& r, const toml::node* n, RoleSpec* role);
void ReadEnv(TableReader& r, RoleSpec* role);
/// `${NAME}` in each argument of `argv` (read from `node`) from dflash-launch's own environment.
void ExpandRefs(TableReader& r, const toml::node* node, const char* key, std::vector<std::string>* argv);

// A [[role]]'s sub-tables (role_lifecycle.cc, role_probes.cc): `n` is the sub-table's node (nullptr: absent),
// `prefix` how the role's keys are shown ("role[drafter]"), `role` the role's reader (for a wrong type).

void ReadGate(const toml::node* n, const std::string& prefix, GateSpec* g, std::vector<ConfigError>* errors,
              TableReader& role);
void ReadRestart(const toml::node* n, const std::string& prefix, RestartSpec* rs, std::vector<ConfigError>* errors,
                 TableReader& role);
void ReadStop(const toml::node* n, const std::string& prefix, StopSpec* s, std::vector<ConfigError>* errors,
              TableReader& role);
/// `ready`, a string (short for { mode = ... }) or a table; `given`: whether the role has one.
void ReadReady(const toml::node* n, const std::string& prefix, ReadySpec* rs, std::vector<ConfigError>* errors,
               TableReader& role, bool* given);
void ReadLiveness(const toml::node* n, const std::string& prefix, LivenessSpec* l, std::vector<ConfigError>* errors,
                  TableReader& role);
/// A probe's named port must be one of the role's `ports`.
void CheckProbePortName(TableReader& r, const char* key, const ProbeSpec& p, const RoleSpec& role);

// ---- shared with validation ----

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
