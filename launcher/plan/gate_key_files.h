// The files behind a derived gate key: the script the role's command runs
// (resolved as Python would: `python train.py`, `python -m pkg.mod`, or a
// `#!` script run directly), the Python modules it imports from outside the
// interpreter's install (its model code), and the role's gate.key_files globs. Their content
// goes into the key, so editing the training code never reuses a stale READY.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "launcher/config/config.h"

namespace dflash {

/// One file that went into a key, for `check` to show.
struct KeyFile {
  std::string why;     ///< "script train.py", "module pkg.train", "import drafter_model", "key_files model/*.py"
  std::string path;    ///< resolved; empty if nothing was found
  std::string sha256;  ///< hex of the content; empty if unreadable or missing
  std::string note;    ///< why there is no hash ("not found", "matches no file"), else empty
};

/// The script a Python command runs (`python -u train.py ...`): the argument as
/// written and its absolute path (from the role's cwd), whether or not it
/// exists. False when the command is not a Python interpreter or runs no file
/// (`-m`, `-c`, stdin): `check` and `run` refuse a missing script before
/// anything is spawned (executable_check.h).
bool PythonScriptOf(const RoleSpec& role, std::string* arg, std::string* path);

/// Finds and hashes the files of `role`'s key. `launcher_env` supplies
/// PATH/PYTHONPATH where the role's env does not. Never fails: what cannot be
/// found is listed with a note (a missing file hashes as "missing", so the key
/// still changes once it appears).
std::vector<KeyFile> CollectKeyFiles(const RoleSpec& role, const std::vector<std::pair<std::string, std::string>>& launcher_env);

}  // namespace dflash
