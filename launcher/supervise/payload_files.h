// The files a payload leaves for the supervisor in its attempt directory: the
// torch.distributed.elastic error file (TORCHELASTIC_ERROR_FILE) and the
// metrics file (DFLASH_METRICS_FILE, format in docs/summary-json.md). Read-only.
#pragma once

#include <nlohmann/json.hpp>

#include <string>

namespace dflash {

/// Reads a torch.distributed.elastic error file (written by @record): the
/// parsed JSON, {"unparsed": text} if it is not JSON, or null if absent or
/// unreadable. `message` gets its message/exception text when present.
nlohmann::json ReadErrorFile(const std::string& path, std::string* message);

/// Reads a DFLASH_METRICS_FILE: the JSON object, or null when it is absent,
/// unreadable, not JSON or not an object (a payload that crashed mid-write).
nlohmann::json ReadMetricsFile(const std::string& path);

/// A metrics counter ("fxgraph_cache_miss"), or -1 when the file lacks it or
/// it is not a number.
int64_t MetricsCounter(const nlohmann::json& metrics, const char* key);

}  // namespace dflash
