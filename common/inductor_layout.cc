#include "common/inductor_layout.h"

#include <algorithm>
#include <vector>

#include "common/split.h"

namespace dflash {
namespace {

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

bool Hex64(const std::string& s) {
  return s.size() == 64 && std::all_of(s.begin(), s.end(), [](char c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'); });
}

bool EndsWith(const std::string& s, const std::string& suffix) {
  return s.size() > suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

/// <sha256 hex><suffix>: the autotune cache's best configs, the CuTe DSL objects.
bool HexNamed(const std::string& name, const std::string& suffix) {
  return EndsWith(name, suffix) && Hex64(name.substr(0, name.size() - suffix.size()));
}

/// Python's tempfile.mkstemp(suffix=".o.tmp"): "tmp" + 8 of [a-z0-9_] + suffix (cutedsl_cache.py).
bool MkstempName(const std::string& name, const std::string& suffix) {
  if (!EndsWith(name, suffix) || name.rfind("tmp", 0) != 0) return false;
  std::string mid = name.substr(3, name.size() - 3 - suffix.size());
  return mid.size() == 8 && std::all_of(mid.begin(), mid.end(), [](char c) {
           return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_';
         });
}

/// Triton's FileCacheManager stages a group in "tmp.pid_<pid>_<uuid hex>/" and renames it into place.
bool TritonStaging(const std::string& s) { return s.rfind("tmp.pid_", 0) == 0; }

/// The top-level dirs of kinds with a fixed name (the kernel dirs, <2>/, are the others).
bool KindTop(const std::string& top) {
  for (const char* k : {"fxgraph", "aotautograd", "locks", "dynamo", "triton", "cache", "cutedsl_compile_cache",
                        "aoti_eager"})
    if (top == k) return true;
  return false;
}

}  // namespace

bool IsContentKind(const std::string& k) {
  for (const char* c : {"fxgraph", "aotautograd", "kernels", "dynamo", "triton", "autotune", "timings", "cutedsl",
                        "aoti_eager", "memoizer"})
    if (k == c) return true;
  return false;
}

std::string CacheKindOf(const std::string& rel) {
  std::vector<std::string> p = SplitOn(rel, '/');
  const std::string& top = p[0];
  const std::string& name = p.back();
  if (top == ".dflash") return p.size() > 1 ? "gate" : "";
  if (!std::all_of(p.begin(), p.end(), PlainName)) return "";
  // Files at the root: the persistent memoizer's dump and its lock (runtime/caching/interfaces.py).
  if (p.size() == 1) return name == "memoizer_cache.json" ? "memoizer" : name == "memoizer_cache.lock" ? "locks" : "";
  bool kernel_dir = KernelDir(top);
  if (!(kernel_dir || KindTop(top))) return "";
  if (AtomicTemp(name)) return "temp";
  if (top == "fxgraph") return p.size() == 4 && KernelDir(p[1]) && LowerAlnum(p[2]) ? "fxgraph" : "";
  if (top == "aotautograd") return p.size() == 3 && LowerAlnum(p[1]) ? "aotautograd" : "";
  if (top == "locks") return p.size() == 2 && EndsWith(name, ".lock") ? "locks" : "";
  if (top == "dynamo") return "dynamo";
  if (top == "triton") {
    if (p.size() < 3) return "";
    for (size_t i = 1; i + 1 < p.size(); ++i)
      if (TritonStaging(p[i])) return "temp";
    return "triton";
  }
  // The max-autotune timings: one JSON per system (GPU model, CUDA, Triton), codecache.py LocalCache.
  if (top == "cache") return p.size() == 2 && Hex64(name) ? "timings" : "";
  if (top == "cutedsl_compile_cache") {
    if (p.size() != 2) return "";
    return HexNamed(name, ".o") ? "cutedsl" : MkstempName(name, ".o.tmp") ? "temp" : "";
  }
  // AOTInductor eager kernels: aoti_eager/<namespace>/<device>/<files> (aoti_eager.py).
  if (top == "aoti_eager") return p.size() >= 4 ? "aoti_eager" : "";
  // A Triton kernel's best config sits beside its source: <2>/<sha256>.best_config (runtime/autotune_cache.py).
  if (p.size() == 2 && HexNamed(name, ".best_config")) return "autotune";
  // <2>/c<2><hash>...: the file (or, for multi-file kernels, the dir) is named after the key that names its dir.
  return p[1].size() > 3 && p[1][0] == 'c' && p[1].compare(1, 2, top) == 0 ? "kernels" : "";
}

bool IsCacheDirPath(const std::string& rel) {
  std::vector<std::string> p = SplitOn(rel, '/');
  if (!std::all_of(p.begin(), p.end(), PlainName)) return false;
  const std::string& top = p[0];
  if (top == "fxgraph") return p.size() == 1 || (p.size() == 2 && KernelDir(p[1])) || (p.size() == 3 && KernelDir(p[1]) && LowerAlnum(p[2]));
  if (top == "aotautograd") return p.size() <= 2 && (p.size() == 1 || LowerAlnum(p[1]));
  if (top == "locks") return p.size() == 1;
  if (top == "dynamo" || top == "triton") return true;
  if (top == "cache" || top == "cutedsl_compile_cache") return p.size() == 1;
  if (top == "aoti_eager") return p.size() <= 3;
  if (KernelDir(top)) return p.size() == 1 || (p[1].size() > 3 && p[1][0] == 'c' && p[1].compare(1, 2, top) == 0);
  return false;
}

bool InductorReads(const std::string& rel) {
  if (rel == ".dflash" || rel.rfind(".dflash/", 0) == 0) return true;
  return IsCacheDirPath(rel) || !CacheKindOf(rel).empty();
}

}  // namespace dflash
