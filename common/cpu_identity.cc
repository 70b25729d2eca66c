#include "common/cpu_identity.h"

#include <sys/utsname.h>

#include <algorithm>
#include <set>
#include <sstream>
#include <vector>

#include "common/fd.h"
#include "common/hash.h"

namespace dflash {
namespace {

constexpr char kTagPrefix[] = "dflash-cpu-";

std::string Trim(std::string_view s) {
  size_t b = s.find_first_not_of(" \t"), e = s.find_last_not_of(" \t\r");
  return b == std::string_view::npos ? std::string() : std::string(s.substr(b, e - b + 1));
}

std::set<std::string> Words(const std::string& s) {
  std::set<std::string> out;
  std::istringstream in(s);
  for (std::string w; in >> w;) out.insert(w);
  return out;
}

}  // namespace

CpuFacts ParseCpuInfo(std::string_view text, std::string arch) {
  CpuFacts f;
  f.arch = std::move(arch);
  size_t at = 0;
  while (at < text.size()) {
    size_t end = text.find('\n', at);
    std::string_view line = text.substr(at, end == std::string_view::npos ? std::string_view::npos : end - at);
    at = end == std::string_view::npos ? text.size() : end + 1;
    if (Trim(line).empty()) {
      if (!f.flags.empty()) break;  // the first processor's block is read
      continue;
    }
    size_t colon = line.find(':');
    if (colon == std::string_view::npos) continue;
    std::string name = Trim(line.substr(0, colon)), value = Trim(line.substr(colon + 1));
    if (name == "vendor_id" || name == "CPU implementer") f.vendor = value;
    else if (name == "cpu family" || name == "CPU architecture") f.family = value;
    else if (name == "model" || name == "CPU part") f.model = value;
    else if (name == "flags" || name == "Features") {
      std::string sorted;
      for (const std::string& w : Words(value)) sorted += (sorted.empty() ? "" : " ") + w;
      f.flags = sorted;
    }
  }
  return f;
}

const CpuFacts& HostCpu() {
  static const CpuFacts facts = [] {
    struct utsname u {};
    std::string arch = ::uname(&u) == 0 ? u.machine : "";
    std::string text, err;
    if (!ReadFile("/proc/cpuinfo", &text, &err)) text.clear();
    return ParseCpuInfo(text, arch);
  }();
  return facts;
}

std::string BestVectorIsa(const CpuFacts& cpu) {
  std::set<std::string> f = Words(cpu.flags);
  auto has = [&](std::initializer_list<const char*> names) {
    return std::all_of(names.begin(), names.end(), [&](const char* n) { return f.count(n) > 0; });
  };
  if (cpu.arch == "x86_64" || cpu.arch == "AMD64") {
    // Inductor's VecAMX, VecAVX512, VecAVX2, in its order of preference (torch/_inductor/cpu_vec_isa.py).
    if (has({"avx512f", "avx512bw", "avx512vl", "avx512dq", "amx_tile"})) return "amx";
    if (has({"avx512f", "avx512bw", "avx512vl", "avx512dq"})) return "avx512";
    if (has({"avx2", "fma"})) return "avx2";
    return "none";
  }
  if (cpu.arch == "aarch64") return f.count("sve") || f.count("sve2") ? "sve" : "neon";
  return cpu.arch.empty() ? "unknown" : cpu.arch;
}

std::string CpuIdentity(const CpuFacts& cpu, const std::optional<std::string>& cap) {
  // The readable part says what differs; the hash of every flag makes two CPUs that differ in any feature
  // -march=native could use two identities (kernels built for one may not run on the other).
  std::string flags_hash = Sha256Hex("dflash-cpu-flags/1\n" + cpu.flags).substr(0, 16);
  return (cpu.arch.empty() ? "unknown" : cpu.arch) + " " + (cpu.vendor.empty() ? "unknown" : cpu.vendor) +
         " family " + (cpu.family.empty() ? "?" : cpu.family) + " model " + (cpu.model.empty() ? "?" : cpu.model) +
         ", best ISA " + BestVectorIsa(cpu) + ", flags " + flags_hash + ", ATEN_CPU_CAPABILITY " +
         (cap ? (cap->empty() ? "empty" : *cap) : "unset");
}

std::string CpuCacheTag(const std::string& identity) {
  return kTagPrefix + Sha256Hex("dflash-cpu-identity/1\n" + identity).substr(0, 16);
}

std::string WithCpuTag(const std::string& user_tag, const std::string& cpu_tag) {
  // Parts are comma-separated; ours replace any earlier dflash-cpu-* (a tag inherited from a launcher's
  // process that started this one), the user's stay in their order.
  std::vector<std::string> parts;
  std::istringstream in(user_tag);
  for (std::string p; std::getline(in, p, ',');)
    if (!p.empty() && p.rfind(kTagPrefix, 0) != 0) parts.push_back(p);
  parts.push_back(cpu_tag);
  std::string out;
  for (const std::string& p : parts) out += (out.empty() ? "" : ",") + p;
  return out;
}

}  // namespace dflash
