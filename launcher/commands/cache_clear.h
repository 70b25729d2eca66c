// `dflash-launch cache clear`: removes what Inductor, Triton and the gate wrote
// in a cache dir (cachelock/cache_inventory.h names those paths), and nothing
// else. A cache_dir pointed at a home directory by mistake loses no file that
// Inductor did not write there: those are listed and left.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "cachelock/cache_inventory.h"

namespace dflash {

struct ClearReport {
  std::map<std::string, KindStats> removed;  // by kind: fxgraph, aotautograd, kernels, locks, temp, ...
  uint64_t files_removed = 0;                // counted as each file was unlinked
  uint64_t ready_removed = 0;                // READY markers
  /// The top-most entries none of them wrote, and how many files each holds: left as they were.
  std::vector<std::pair<std::string, uint64_t>> left;

  /// "removed 35 files (fxgraph 3 (11 KB), ...) and 1 READY marker"
  std::string Describe() const;
};

/// READY markers first (with none left nobody trusts what remains), then each
/// entry that is wholly Inductor's is renamed aside in one step (a reader sees
/// it whole or not at all) into `.dflash/trash-*` and deleted there, never
/// following a link. Entries with foreign files inside are descended into and
/// only their Inductor files go. REQUIRES: the caller holds the cache's gate
/// and has checked the dir (CheckSecurePath, CheckPrivateTree).
bool ClearCache(const std::string& dir, ClearReport* report, std::string* err);

}  // namespace dflash
