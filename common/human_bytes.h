// One way to say a size to a person ("3.1 MB"): the cache tools, the seed and the run's summary table. In common
// so that a room that only prints a size does not link the cache archives (libarchive) for it.
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>

namespace dflash {

/// "512 B", "11.0 KB", "2.9 MB", "1.25 GB" (1024-based).
inline std::string HumanBytes(uint64_t b) {
  char buf[32];
  if (b < 1024) std::snprintf(buf, sizeof buf, "%llu B", static_cast<unsigned long long>(b));
  else if (b < (1u << 20)) std::snprintf(buf, sizeof buf, "%.1f KB", b / 1024.0);
  else if (b < (1ull << 30)) std::snprintf(buf, sizeof buf, "%.1f MB", b / 1048576.0);
  else std::snprintf(buf, sizeof buf, "%.2f GB", b / 1073741824.0);
  return buf;
}

}  // namespace dflash
