// The files behind a derived gate key: the script the role's command runs
// (resolved as Python would: `python train.py`, `python -m pkg.mod`, or a
// `#!` script run directly) and the role's gate.key_files globs. Their content
// goes into the key, so editing the training code never reuses a stale READY.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "launcher/config/config.h"

namespace dflash {

/// One file that went into a key, for `check` to show.
struct KeyFile {
  std::string why;     ///< "script", "module dflash_launch.reference_drafter", "key_files model/*.py"
  std::string path;    ///< resolved; empty if nothing was found
  std::string sha256;  ///< hex of the content; empty if unreadable or missing
  std::string note;    ///< why there is no hash ("not found", "matches no file"), else empty
};

/// Finds and hashes the files of `role`'s key. `launcher_env` supplies
/// PATH/PYTHONPATH where the role's env does not. Never fails: what cannot be
/// found is listed with a note (a missing file hashes as "missing", so the key
/// still changes once it appears).
std::vector<KeyFile> CollectKeyFiles(const RoleSpec& role, const std::vector<std::pair<std::string, std::string>>& launcher_env);

}  // namespace dflash
