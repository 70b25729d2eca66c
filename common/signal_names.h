// Signal names as run.toml spells them ("SIGTERM", "TERM") and back.
#pragma once

#include <string>
#include <string_view>

namespace dflash {

/// "SIGTERM", "TERM" or "sigterm" -> SIGTERM; 0 if unknown. Numbers are not
/// accepted: they differ between architectures and people misread them.
int SignalFromName(std::string_view name);

/// SIGTERM -> "SIGTERM"; "SIG<n>" for signals without a name.
std::string SignalName(int sig);

/// All names SignalFromName knows, for "did you mean" hints.
const char* const* SignalNames();

}  // namespace dflash
