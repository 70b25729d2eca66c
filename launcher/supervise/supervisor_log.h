// The supervisor's own log file (spdlog), opened O_CLOEXEC. Debian's spdlog
// file sinks open without FD_CLOEXEC (facts.md); this sink writes to an fd we own.
#pragma once

#include <spdlog/logger.h>

#include <memory>
#include <string>

namespace dflash {

/// A logger writing "time level message" lines to `path` (created 0644, appended).
/// Never call it between fork and exec: spdlog is not fork-safe.
/// A line that does not fit (disk full) is taken back whole, never left cut
/// mid-line; SupervisorLogLoss says what was lost.
std::shared_ptr<spdlog::logger> OpenSupervisorLog(const std::string& path, std::string* err);

/// "" if every line of `log` (from OpenSupervisorLog) reached its file; else
/// "supervisor.log lost 12 lines from 2026-12-02 04:40:01 on: write: No space left on device".
std::string SupervisorLogLoss(const spdlog::logger& log);

}  // namespace dflash
