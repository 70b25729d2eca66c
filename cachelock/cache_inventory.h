// What is in a compile cache dir: which files Inductor, Triton and the gate
// wrote (by kind, with bytes), and what none of them wrote. For `cache status`,
// the before/after of `seed`, what `export` archives and what `clear` removes.
#pragma once

#include <sys/types.h>

#include <nlohmann/json.hpp>

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "common/human_bytes.h"  // the size its Describe and its users print
#include "common/inductor_layout.h"

namespace dflash {

struct KindStats {
  uint64_t files = 0;
  uint64_t bytes = 0;
};

/// One file (or link, or special file) under the cache, never followed.
struct CacheFile {
  std::string rel;
  std::string kind;  // "" if not Inductor's/Triton's/the gate's, or if not a regular file
  mode_t type = 0;   // S_IFREG, S_IFLNK, ...
  uint64_t bytes = 0;
};

/// Every non-directory under `dir` (lstat; `.dflash/` skipped), sorted by path.
bool ListCache(const std::string& dir, std::vector<CacheFile>* out, std::string* err);

struct CacheInventory {
  bool exists = false;
  std::map<std::string, KindStats> kinds;  // "fxgraph", "aotautograd", "kernels", "dynamo", "triton"
  uint64_t total_files = 0;
  uint64_t total_bytes = 0;
  uint64_t foreign_files = 0;  // files none of them wrote (and links): left alone by every cache command

  /// "fxgraph 2 (11 KB), aotautograd 1 (40 KB), kernels 38 (2.9 MB)"
  std::string Describe() const;
  nlohmann::json ToJson() const;
};

CacheInventory ScanCache(const std::string& dir);

/// Every content file under `dir` (relative paths, sorted; regular files
/// only, never through a link): what export archives.
std::vector<std::string> CacheContentFiles(const std::string& dir);

}  // namespace dflash
