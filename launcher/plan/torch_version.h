// torch's version as a role's processes will import it: part of the default gate
// key, so a torch upgrade never reuses a stale READY marker.
#pragma once

#include <string>
#include <vector>

#include "common/duration.h"
#include "launcher/config/config.h"

namespace dflash {

/// For a command role: asks the role's Python for importlib.metadata.version("torch")
/// without importing torch (~50 ms). The Python is command[0] if it is a python,
/// else `python3`, found in the PATH of the role's environment (the launcher's
/// environment with the role's `env` on top: what its processes get), run in the
/// role's cwd -- so the version is that of the interpreter the role will run, not
/// whichever python the launcher's PATH finds. For a builtin role: the LibTorch this
/// project was built against. "none" if torch is not installed there, "unknown" if
/// the interpreter could not be asked; results are cached per (python, PATH, cwd).
std::string TorchVersionFor(const RoleSpec& role);

/// The probe itself: runs `python -c ...` through Spawn (no shell) with exactly
/// `env`, in `cwd`, stdout into a pipe, stderr to /dev/null; a probe that takes
/// longer than `timeout` is SIGKILLed and reaped ("unknown").
std::string AskPythonForTorchVersion(const std::string& python, const std::vector<std::string>& env,
                                     const std::string& cwd, Millis timeout);

/// For a GPU role's gate key and READY record: "cuda <torch.version.cuda> triton <version>" from
/// the role's Python (the same one TorchVersionFor asks, same cache rules), read without importing
/// torch or triton; "libtorch <version>" for a builtin role; "unknown" if it could not be asked.
std::string CudaRuntimeFor(const RoleSpec& role);

/// The probe behind both: `python -c script`'s first line of stdout ("unknown" on failure).
std::string AskPython(const std::string& python, const char* script, const std::vector<std::string>& env,
                      const std::string& cwd, Millis timeout);

/// The LibTorch version dflash-builtin was built with ("none" without LibTorch).
std::string BuiltinTorchVersion();

}  // namespace dflash
