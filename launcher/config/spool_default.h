// The default spool dir, /dev/shm/dflash-<uid>-<name>, is a name anyone can
// guess and make first in the shared /dev/shm. Refusing it (it is not ours)
// would let another user block every run of the config, spool or not; so a
// fresh name nobody could have guessed is used instead, and said.
#pragma once

#include <string>
#include <vector>

#include "common/secure_path.h"
#include "launcher/config/config.h"
#include "launcher/config/config_error.h"

namespace dflash {

/// `run->spool_dir` (the default) was refused for `why`: sets it to
/// `<it>-<16 random hex digits>` if that does not exist and its way there passes
/// `use`, and `run->spool_dir_note` to the warning that says so. False (nothing
/// changed) if no such name can be had (the parent is unsafe too, no randomness).
bool UnguessableSpoolDir(const PathUse& use, RunSpec* run, const std::string& why);

/// The warning of a spool dir UnguessableSpoolDir chose (none otherwise): part of ConfigWarnings.
void AddSpoolDirWarning(const RunConfig& config, std::vector<ConfigError>* warnings);

}  // namespace dflash
