// torch's version as a role's processes will import it: part of the default gate
// key, so a torch upgrade never reuses a stale READY marker.
#pragma once

#include <string>

#include "launcher/config.h"

namespace dflash {

/// For a command role: asks the role's Python (command[0] if it is a python,
/// else python3 on PATH) for importlib.metadata.version("torch") without
/// importing torch (~50 ms). For a builtin role: the LibTorch this project was
/// built against. "none" if torch is not installed; results are cached per interpreter.
std::string TorchVersionFor(const RoleSpec& role);

/// The LibTorch version dflash-builtin was built with ("none" without LibTorch).
std::string BuiltinTorchVersion();

}  // namespace dflash
