// What is in a compile cache dir: entries and bytes per kind, the READY keys and
// who holds the gate. For `cache status`, and the before/after of `seed`.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace dflash {

struct KindStats {
  uint64_t files = 0;
  uint64_t bytes = 0;
};

/// Inductor's layout under TORCHINDUCTOR_CACHE_DIR on this torch: fxgraph/ (FX
/// graph cache), aotautograd/ (AOTAutograd cache), two-letter dirs of C++
/// kernels (.cpp/.so/.py), triton/ (GPU kernels), locks/ (Inductor's own build
/// locks, not content) and .dflash/ (our gate and READY markers).
struct CacheInventory {
  bool exists = false;
  std::map<std::string, KindStats> kinds;  // "fxgraph", "aotautograd", "kernels", "triton", "other"
  uint64_t total_files = 0;
  uint64_t total_bytes = 0;

  /// "fxgraph 2 (11 KB), aotautograd 1 (40 KB), kernels 38 (2.9 MB)"
  std::string Describe() const;
  nlohmann::json ToJson() const;
};

/// The kind a path relative to the cache root belongs to ("" for files that
/// are not content: the gate, locks/, temp files).
std::string CacheKindOf(const std::string& rel_path);

CacheInventory ScanCache(const std::string& dir);

/// "3.1 MB"
std::string HumanBytes(uint64_t bytes);

/// Every content file under `dir` (relative paths, sorted): what export archives.
std::vector<std::string> CacheContentFiles(const std::string& dir);

}  // namespace dflash
