// The files a payload leaves for the supervisor in its attempt directory: the
// torch.distributed.elastic error file (TORCHELASTIC_ERROR_FILE) and the
// metrics file (DFLASH_METRICS_FILE, format in docs/summary-json.md). Read-only,
// and never trusted: the payload may have put a FIFO, a link or gigabytes there,
// and the supervisor reads them on its loop thread (common/untrusted_file.h).
#pragma once

#include <nlohmann/json.hpp>

#include <cstddef>
#include <string>

namespace dflash {

/// The most the supervisor reads of a metrics file. The Python TrainingMetrics keeps at most 2000 loss points
/// (~50 KB), but the builtin drafter writes every step's loss (~20 bytes a step): 8 MiB is ~400k steps, and
/// parsed (~0.1 s) on the loop thread every 2 s at worst.
inline constexpr size_t kMetricsFileLimit = size_t{8} << 20;
/// The most it reads of an error file: torch's @record writes a message and a traceback (a few KB; a summary
/// keeps 4 KB of one that is not JSON), so 1 MiB is room for any traceback and still nothing to wait for.
inline constexpr size_t kErrorFileLimit = size_t{1} << 20;

/// How deep a payload file's JSON may nest: its own metrics are 2 levels deep; deeper is refused, as the
/// summary's dump of it recurses.
inline constexpr int kPayloadJsonDepth = 64;

/// Reads a torch.distributed.elastic error file (written by @record) under
/// `run_dir` (nothing on the way below it is a link): the parsed JSON,
/// {"unparsed": text} if it is not JSON, or null if absent or unreadable.
/// `message` gets its message/exception text when present; `unreadable` (if
/// given) why it could not be read ("a FIFO, not a regular file"), else "".
nlohmann::json ReadErrorFile(const std::string& path, const std::string& run_dir, std::string* message,
                             std::string* unreadable = nullptr);

/// Reads a DFLASH_METRICS_FILE under `run_dir`: the JSON object, or null when it
/// is absent, unreadable, not JSON or not an object (a payload that crashed
/// mid-write). `unreadable` as for ReadErrorFile.
nlohmann::json ReadMetricsFile(const std::string& path, const std::string& run_dir, std::string* unreadable = nullptr);

/// A metrics counter ("fxgraph_cache_miss"), or -1 when the file lacks it or
/// it is not a number.
int64_t MetricsCounter(const nlohmann::json& metrics, const char* key);

}  // namespace dflash
