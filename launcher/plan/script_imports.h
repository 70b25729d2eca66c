// `check`: the imports of a Python role's script that its interpreter cannot find. A module that moved or was
// never installed fails the process at its first line, seconds into a run that `check` passed (issue #59: a
// week-old script importing dflash_launch.spool_world); named here with its file:line, before anything starts.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "launcher/config/config.h"

namespace dflash {

/// One import of a role's script that the role's Python cannot resolve.
struct UnresolvedImport {
  std::string role;
  std::string file;    ///< the script, absolute
  int line = 0;
  std::string module;  ///< as the script names it: "dflash_launch.spool_world"
  std::string python;  ///< the role's interpreter (its command[0])
  bool script_changes_sys_path = false;  ///< the script says sys.path: it may find the module itself
};

/// For each role that runs a Python script (`python [opts] train.py`; not -m, -c, builtin roles), the imports of
/// the script itself that its interpreter, from the role's cwd with its PYTHONPATH, cannot find. Static (ast +
/// importlib's path search; no module of the script is run, a top-level package's own code included). Left out, so
/// that a warning means a failure: imports inside a try (the script handles their absence), relative imports, and
/// a name its parent package's source mentions (it may be made at import time: six.moves). A role whose Python
/// cannot be asked is left out too. `launcher_env` supplies PYTHONPATH where the role's env does not.
std::vector<UnresolvedImport> UnresolvedImports(const RunConfig& config,
                                                const std::vector<std::pair<std::string, std::string>>& launcher_env);

/// "<file>:<line>: warning: role[r]: imports <module>, which <python> cannot find ..." and a hint, one per import.
std::string FormatUnresolvedImports(const std::vector<UnresolvedImport>& found);

}  // namespace dflash
