// summary.json from the supervisor's process table: per process its last
// attempt, every attempt's history, the culprit and the files its payload left
// (error file, metrics). Reads files; decides nothing.
#pragma once

#include <string>

#include "launcher/report/run_summary.h"
#include "launcher/core/supervisor_core.h"

namespace dflash {

/// `start_error`: the loop could not even start (then nothing ran: never success).
RunSummary BuildRunSummary(const SupervisorCore& core, double wall_s, const std::string& start_error);

}  // namespace dflash
