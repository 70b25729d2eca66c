// The end of a run (run_summary.h) printed as a table and written to <log_dir>/<run_id>/summary.json
// (docs/summary-json.md).
#pragma once

#include <nlohmann/json.hpp>

#include <string>

#include "launcher/core/run_summary.h"

namespace dflash {

/// "role rank pid state exit/signal restarts runtime" rows, culprit marked.
std::string SummaryTable(const RunSummary& s, bool color);
nlohmann::ordered_json SummaryJson(const RunSummary& s);

}  // namespace dflash
