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
/// exec: spdlog is not fork-safe. A line that does not fit (disk full) is taken
/// back whole, never left cut mid-line; SupervisorLogLoss says what was lost.
std::shared_ptr<spdlog::logger> OpenSupervisorLog(const std::string& path, const FileMode& files, std::string* err);

/// "" if every line of `log` (from OpenSupervisorLog) reached its file; else
/// "supervisor.log lost 12 lines from 2026-12-02 04:40:01 on: write: No space left on device".
std::string SupervisorLogLoss(const spdlog::logger& log);

}  // namespace dflash
