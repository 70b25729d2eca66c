// The CPU a compiled kernel is for: what Inductor's own cache keys leave out on CPU.
//
// torch 2.13's FX-graph and AOTAutograd keys hold no CPU facts when there is no CUDA (CacheBase.get_system() is
// empty), and the vector ISA Inductor picks (its best for the CPU's flags, or ATEN_CPU_CAPABILITY's) is not in
// them: an entry an AVX-512 process wrote is a hit for a process that picks AVX2, and computes wrong values there
// (docs/cachelock.md, "The CPU is in every key"). Its kernels are built with -march=native, so the CPU model's
// features matter too. The identity below names both; its tag goes into every process's
// TORCH_COMPILE_CACHE_KEY_TAG (torch.compiler.config.cache_key_tag, which both keys hash), the gate key, READY
// and exported archives, so that no process ever loads an entry made for another CPU or ISA.
#pragma once

#include <optional>
#include <string>
#include <string_view>

namespace dflash {

/// The facts of one processor that decide what Inductor compiles for it.
struct CpuFacts {
  std::string arch;     ///< uname's machine: "x86_64", "aarch64"
  std::string vendor;   ///< "GenuineIntel", "AuthenticAMD", ...
  std::string family;   ///< "cpu family" (x86) or "CPU architecture" (arm)
  std::string model;    ///< "model" (x86) or "CPU part" (arm)
  std::string flags;    ///< "flags" (x86) or "Features" (arm), sorted, one space apart
};

/// The first processor's facts from /proc/cpuinfo's text (`cpuinfo`), on `arch`.
CpuFacts ParseCpuInfo(std::string_view cpuinfo, std::string arch);

/// This host's (reads /proc/cpuinfo once per process; empty fields where it cannot be read).
const CpuFacts& HostCpu();

/// The best vector ISA Inductor can pick on `cpu` (x86: "amx", "avx512", "avx2", "none"; arm: "sve", "neon").
std::string BestVectorIsa(const CpuFacts& cpu);

/// What a process compiles for: the CPU and the ATEN_CPU_CAPABILITY it runs with (nullopt: unset), e.g.
/// "x86_64 AuthenticAMD family 23 model 49, best ISA avx2, flags 5c1f0e2a9b3d7c44, ATEN_CPU_CAPABILITY unset".
/// Two processes may share compiled entries only when their identities are equal.
std::string CpuIdentity(const CpuFacts& cpu, const std::optional<std::string>& aten_cpu_capability);

/// The tag of an identity, as it goes into TORCH_COMPILE_CACHE_KEY_TAG: "dflash-cpu-<16 hex>".
std::string CpuCacheTag(const std::string& identity);

/// The process's TORCH_COMPILE_CACHE_KEY_TAG: the user's own tag (`user_tag`, may be empty) with `cpu_tag` in it,
/// once. A dflash-cpu-* part the user's tag already has (a process started by one of ours) is replaced.
std::string WithCpuTag(const std::string& user_tag, const std::string& cpu_tag);

}  // namespace dflash
