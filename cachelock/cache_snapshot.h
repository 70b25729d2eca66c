// What a leader changed in the cache: a cheap before/after look (file count,
// bytes, newest mtime) that lets the gate refuse to promise "the cache is warm"
// for a leader that wrote nothing. The gate's own .dflash/ is not counted.
#pragma once

#include <cstdint>
#include <string>

namespace dflash {

struct CacheSnapshot {
  uint64_t files = 0;
  uint64_t bytes = 0;
  int64_t newest_mtime_ns = 0;

  bool operator==(const CacheSnapshot&) const = default;
};

/// Walks `dir` without following symlinks; a missing dir is an empty snapshot.
CacheSnapshot SnapshotCache(const std::string& dir);

}  // namespace dflash
