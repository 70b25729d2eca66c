#include "cachelock/cache_inventory.h"

#include <sys/stat.h>

#include <algorithm>
#include <cstdio>

#include "common/secure_path.h"

namespace dflash {

bool ListCache(const std::string& dir, std::vector<CacheFile>* out, std::string* err) {
  out->clear();
  bool ok = WalkTree(dir, [&](const std::string& rel, const struct stat& st) {
    if (rel == ".dflash") return false;
    if (S_ISDIR(st.st_mode)) return true;
    CacheFile f;
    f.rel = rel;
    f.type = st.st_mode & S_IFMT;
    f.bytes = static_cast<uint64_t>(st.st_size);
    f.kind = S_ISREG(st.st_mode) ? CacheKindOf(rel) : "";
    out->push_back(std::move(f));
    return true;
  }, err);
  std::sort(out->begin(), out->end(), [](const CacheFile& a, const CacheFile& b) { return a.rel < b.rel; });
  return ok;
}

std::vector<std::string> CacheContentFiles(const std::string& dir) {
  std::vector<CacheFile> files;
  std::string err;
  std::vector<std::string> out;
  if (!ListCache(dir, &files, &err)) return out;
  for (const CacheFile& f : files)
    if (IsContentKind(f.kind)) out.push_back(f.rel);
  return out;
}

CacheInventory ScanCache(const std::string& dir) {
  CacheInventory inv;
  struct stat st {};
  inv.exists = ::stat(dir.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
  for (const char* k : {"fxgraph", "aotautograd", "kernels", "triton"}) inv.kinds[k];
  std::vector<CacheFile> files;
  std::string err;
  if (!inv.exists || !ListCache(dir, &files, &err)) return inv;
  for (const CacheFile& f : files) {
    if (f.kind.empty()) ++inv.foreign_files;
    if (!IsContentKind(f.kind)) continue;
    KindStats& k = inv.kinds[f.kind];
    ++k.files;
    k.bytes += f.bytes;
    ++inv.total_files;
    inv.total_bytes += f.bytes;
  }
  return inv;
}

std::string CacheInventory::Describe() const {
  std::string s;
  for (const auto& [name, k] : kinds) {
    if (k.files == 0) continue;
    if (!s.empty()) s += ", ";
    s += name + " " + std::to_string(k.files) + " (" + HumanBytes(k.bytes) + ")";
  }
  s = s.empty() ? "empty" : s + "; total " + HumanBytes(total_bytes);
  if (foreign_files) s += "; and " + std::to_string(foreign_files) + " files Inductor did not write";
  return s;
}

nlohmann::json CacheInventory::ToJson() const {
  nlohmann::json j = {{"exists", exists}, {"files", total_files}, {"bytes", total_bytes},
                      {"foreign_files", foreign_files}};
  for (const auto& [name, k] : kinds) j["kinds"][name] = {{"files", k.files}, {"bytes", k.bytes}};
  return j;
}

}  // namespace dflash
