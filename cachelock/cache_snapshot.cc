#include "cachelock/cache_snapshot.h"

#include <ftw.h>
#include <sys/stat.h>

#include <cstring>

namespace dflash {
namespace {

thread_local CacheSnapshot* g_snapshot = nullptr;  // nftw has no user pointer

int Visit(const char* path, const struct stat* st, int type, FTW* ftw) {
  if (type == FTW_D && ftw->level == 1 && std::strcmp(path + ftw->base, ".dflash") == 0) return FTW_SKIP_SUBTREE;
  if (type != FTW_F) return FTW_CONTINUE;
  g_snapshot->files += 1;
  g_snapshot->bytes += static_cast<uint64_t>(st->st_size);
  int64_t m = static_cast<int64_t>(st->st_mtim.tv_sec) * 1'000'000'000 + st->st_mtim.tv_nsec;
  if (m > g_snapshot->newest_mtime_ns) g_snapshot->newest_mtime_ns = m;
  return FTW_CONTINUE;
}

}  // namespace

CacheSnapshot SnapshotCache(const std::string& dir) {
  CacheSnapshot s;
  g_snapshot = &s;
  ::nftw(dir.c_str(), Visit, 32, FTW_PHYS | FTW_ACTIONRETVAL);
  g_snapshot = nullptr;
  return s;
}

}  // namespace dflash
