#include "common/inductor_layout.h"

#include <algorithm>
#include <vector>

namespace dflash {
namespace {

std::vector<std::string> Parts(const std::string& rel) {
  std::vector<std::string> out;
  size_t i = 0;
  while (i <= rel.size()) {
    size_t j = rel.find('/', i);
    if (j == std::string::npos) j = rel.size();
    out.push_back(rel.substr(i, j - i));
    i = j + 1;
  }
  return out;
}

bool LowerAlnum(const std::string& s) {
  return !s.empty() && std::all_of(s.begin(), s.end(), [](char c) { return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9'); });
}

/// A name Inductor/Triton generate: hashes, dots, dashes, underscores; never "." or "..".
bool PlainName(const std::string& s) {
  if (s.empty() || s == "." || s == "..") return false;
  return std::all_of(s.begin(), s.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' || c == '_' ||
           c == '-';
  });
}

/// Inductor's write_atomic temp file: ".<pid>.<thread id>.tmp".
bool AtomicTemp(const std::string& name) {
  if (name.size() < 7 || name[0] != '.' || name.compare(name.size() - 4, 4, ".tmp") != 0) return false;
  std::string mid = name.substr(1, name.size() - 5);
  size_t dot = mid.find('.');
  auto digits = [](const std::string& s) {
    return !s.empty() && std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; });
  };
  return dot != std::string::npos && digits(mid.substr(0, dot)) && digits(mid.substr(dot + 1));
}

bool KernelDir(const std::string& s) { return s.size() == 2 && LowerAlnum(s); }

}  // namespace

bool IsContentKind(const std::string& k) {
  return k == "fxgraph" || k == "aotautograd" || k == "kernels" || k == "dynamo" || k == "triton";
}

std::string CacheKindOf(const std::string& rel) {
  std::vector<std::string> p = Parts(rel);
  const std::string& top = p[0];
  const std::string& name = p.back();
  if (top == ".dflash") return p.size() > 1 ? "gate" : "";
  if (!std::all_of(p.begin(), p.end(), PlainName)) return "";
  bool kernel_dir = KernelDir(top);
  bool kind_dir = top == "fxgraph" || top == "aotautograd" || top == "locks" || top == "dynamo" || top == "triton";
  if (p.size() < 2 || !(kernel_dir || kind_dir)) return "";
  if (AtomicTemp(name)) return "temp";
  if (top == "fxgraph") return p.size() == 4 && KernelDir(p[1]) && LowerAlnum(p[2]) ? "fxgraph" : "";
  if (top == "aotautograd") return p.size() == 3 && LowerAlnum(p[1]) ? "aotautograd" : "";
  if (top == "locks") return p.size() == 2 && name.size() > 5 && name.compare(name.size() - 5, 5, ".lock") == 0 ? "locks" : "";
  if (top == "dynamo") return "dynamo";
  if (top == "triton") return p.size() >= 3 ? "triton" : "";
  // <2>/c<2><hash>...: the file (or, for multi-file kernels, the dir) is named after the key that names its dir.
  return p[1].size() > 3 && p[1][0] == 'c' && p[1].compare(1, 2, top) == 0 ? "kernels" : "";
}

bool IsCacheDirPath(const std::string& rel) {
  std::vector<std::string> p = Parts(rel);
  if (!std::all_of(p.begin(), p.end(), PlainName)) return false;
  const std::string& top = p[0];
  if (top == "fxgraph") return p.size() == 1 || (p.size() == 2 && KernelDir(p[1])) || (p.size() == 3 && KernelDir(p[1]) && LowerAlnum(p[2]));
  if (top == "aotautograd") return p.size() <= 2 && (p.size() == 1 || LowerAlnum(p[1]));
  if (top == "locks") return p.size() == 1;
  if (top == "dynamo" || top == "triton") return true;
  if (KernelDir(top)) return p.size() == 1 || (p[1].size() > 3 && p[1][0] == 'c' && p[1].compare(1, 2, top) == 0);
  return false;
}

bool InductorReads(const std::string& rel) {
  if (rel == ".dflash" || rel.rfind(".dflash/", 0) == 0) return true;
  return IsCacheDirPath(rel) || !CacheKindOf(rel).empty();
}

}  // namespace dflash
