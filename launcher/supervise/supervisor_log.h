// The supervisor's own log file (spdlog), opened O_CLOEXEC. Debian's spdlog
// file sinks open without FD_CLOEXEC (facts.md); this sink writes to an fd we own.
#pragma once

#include <spdlog/logger.h>

#include <memory>
#include <string>

#include "common/private_files.h"

namespace dflash {

/// A logger writing "time level message" lines to `path` (created with
/// `files.file` in a run dir checked as common/private_files.h says, appended;
/// refused if it is a link or someone else's). Never call it between fork and
/// exec: spdlog is not fork-safe.
std::shared_ptr<spdlog::logger> OpenSupervisorLog(const std::string& path, const FileMode& files, std::string* err);

}  // namespace dflash
