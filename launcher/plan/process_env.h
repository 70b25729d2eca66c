// A process's environment, built in one place (the names: contract/env_vars.h).
// `check` prints Plan::ProcessEnv; the supervisor and `seed` spawn with
// SpawnEnvironment(launcher's env, Plan::ProcessEnv(...)), so what `check`
// shows is what the process gets, and nothing the launcher owns leaks in from
// the launcher's own environment.
#pragma once

#include <string>
#include <utility>
#include <vector>

namespace dflash {

using EnvList = std::vector<std::pair<std::string, std::string>>;

/// What only the spawner knows. Plan::ProcessEnv without one (`check`) shows
/// placeholders for these values.
struct SpawnContext {
  std::string notify_socket;  ///< the supervisor's NOTIFY_SOCKET; empty: none (seed)
  std::string run_token;      ///< DFLASH_RUN_TOKEN; empty: none (seed)
  bool watched = true;        ///< false: no supervisor pings a watchdog (seed): no WATCHDOG_USEC
};

/// `inherited` ("NAME=value", the launcher's own environment) without any
/// variable dflash-launch or dflash-worker owns (env::IsOwnedVar), then every
/// entry of `process_env` set over it (a later entry of one name wins).
std::vector<std::string> SpawnEnvironment(std::vector<std::string> inherited, const EnvList& process_env);

}  // namespace dflash
