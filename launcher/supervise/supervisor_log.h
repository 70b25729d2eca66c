// The supervisor's own log file (spdlog), opened O_CLOEXEC. Debian's spdlog
// file sinks open without FD_CLOEXEC (facts.md); this sink writes to an fd we own.
#pragma once

#include <spdlog/logger.h>

#include <memory>
#include <string>

namespace dflash {

/// A logger writing "time level message" lines to `path` (created 0644, appended).
/// Never call it between fork and exec: spdlog is not fork-safe.
std::shared_ptr<spdlog::logger> OpenSupervisorLog(const std::string& path, std::string* err);

}  // namespace dflash
