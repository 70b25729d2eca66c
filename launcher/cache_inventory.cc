#include "launcher/cache_inventory.h"

#include <algorithm>
#include <cstdio>
#include <filesystem>

namespace dflash {
namespace fs = std::filesystem;

std::string HumanBytes(uint64_t b) {
  char buf[32];
  if (b < 1024) std::snprintf(buf, sizeof buf, "%llu B", static_cast<unsigned long long>(b));
  else if (b < (1u << 20)) std::snprintf(buf, sizeof buf, "%.1f KB", b / 1024.0);
  else if (b < (1ull << 30)) std::snprintf(buf, sizeof buf, "%.1f MB", b / 1048576.0);
  else std::snprintf(buf, sizeof buf, "%.2f GB", b / 1073741824.0);
  return buf;
}

std::string CacheKindOf(const std::string& rel) {
  std::string top = rel.substr(0, rel.find('/'));
  std::string name = fs::path(rel).filename().string();
  if (top == ".dflash" || top == "locks" || rel == top) return "";  // the gate, build locks, stray root files
  if (name.find(".tmp") != std::string::npos || name.rfind(".", 0) == 0) return "";  // writes in flight
  if (top == "fxgraph" || top == "aotautograd" || top == "triton") return top;
  if (top.size() == 2) return "kernels";
  return "other";
}

std::vector<std::string> CacheContentFiles(const std::string& dir) {
  std::vector<std::string> out;
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return out;
  for (auto it = fs::recursive_directory_iterator(dir, fs::directory_options::skip_permission_denied, ec);
       it != fs::recursive_directory_iterator(); it.increment(ec)) {
    if (ec) break;
    if (!it->is_regular_file(ec)) continue;
    std::string rel = fs::relative(it->path(), dir, ec).string();
    if (!CacheKindOf(rel).empty()) out.push_back(rel);
  }
  std::sort(out.begin(), out.end());
  return out;
}

CacheInventory ScanCache(const std::string& dir) {
  CacheInventory inv;
  std::error_code ec;
  inv.exists = fs::is_directory(dir, ec);
  for (const char* k : {"fxgraph", "aotautograd", "kernels", "triton", "other"}) inv.kinds[k];
  for (const std::string& rel : CacheContentFiles(dir)) {
    uint64_t size = fs::file_size(fs::path(dir) / rel, ec);
    if (ec) continue;
    KindStats& k = inv.kinds[CacheKindOf(rel)];
    ++k.files;
    k.bytes += size;
    ++inv.total_files;
    inv.total_bytes += size;
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
  return s.empty() ? "empty" : s + "; total " + HumanBytes(total_bytes);
}

nlohmann::json CacheInventory::ToJson() const {
  nlohmann::json j = {{"exists", exists}, {"files", total_files}, {"bytes", total_bytes}};
  for (const auto& [name, k] : kinds) j["kinds"][name] = {{"files", k.files}, {"bytes", k.bytes}};
  return j;
}

}  // namespace dflash
