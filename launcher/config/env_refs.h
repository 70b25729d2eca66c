// `${NAME}` in a role's command: a value from dflash-launch's own environment, so a shipped config can name what
// differs per machine (a model's path: configs/dflash-8gpu.toml's ${DFLASH_TARGET_MODEL}) and `check` refuses
// the config while it is missing, before anything starts.
#pragma once

#include <functional>
#include <string>

namespace dflash {

/// NAME's value, or nullptr when it is unset.
using EnvLookup = std::function<const char*(const std::string& name)>;

/// `in` with each `${NAME}` (NAME: [A-Za-z_][A-Za-z0-9_]*) replaced by its value; `$${` is a literal `${`, any other
/// `$` stays as it is (a shell's `$HOME` in `sh -c '...'` is the shell's). False, with `*name` and `*why`
/// ("unset", "empty", "an unfinished ${", "not a variable name"), when a reference cannot be expanded: an empty
/// value would pass an empty argument, never what was meant.
bool ExpandEnvRefs(const std::string& in, const EnvLookup& lookup, std::string* out, std::string* name,
                   std::string* why);

}  // namespace dflash
