// Which paths under a compile cache dir Inductor, Triton and the gate write
// (and read): what the cache tools may remove and export, and the part of the
// tree the gate's security check covers.
#pragma once

#include <string>

namespace dflash {

/// Inductor's layout under TORCHINDUCTOR_CACHE_DIR on torch 2.11-2.13 (CPU listed from a
/// real torch.compile, tests/test_adversarial_cache.py; the CUDA-only paths read from
/// torch 2.13's source, named in cachelock/cache_inventory_test.cc):
///   fxgraph/<2>/<key>/<entry>          FX graph cache
///   aotautograd/<key>/<entry>          AOTAutograd cache
///   <2>/c<2><hash>[.main].{cpp,so,py}  C++ and Triton kernels and wrappers (<2> = key[1:3])
///   <2>/<sha256>.best_config           a Triton kernel's autotuned config (runtime/autotune_cache.py)
///   cache/<system sha256>              max-autotune timings per GPU/CUDA/Triton (codecache.py LocalCache)
///   cutedsl_compile_cache/<sha256>.o   CuTe DSL kernels (runtime/cutedsl_cache.py; tmp*.o.tmp in flight)
///   aoti_eager/<ns>/<device>/<file>    AOTInductor eager kernels (aoti_eager.py)
///   memoizer_cache.json                the persistent memoizer's dump (runtime/caching/interfaces.py)
///   locks/<key>.lock, memoizer_cache.lock   Inductor's locks (not content)
///   dynamo/<name>                      Dynamo's PGO state and precompile entries
///   triton/[<device>/]<key>/<file>     Triton kernels (GPU; TRITON_CACHE_DIR); tmp.pid_<pid>_<uuid>/ in flight
///   .<pid>.<tid>.tmp                   Inductor's atomic writes in flight (in any of these)
///   .dflash/...                        our gate and READY markers
/// Anything else was not written by them (precompiled_headers/ and the new cache/<name>/ of
/// torch/_inductor/cache.py go to the default dir, never TORCHINDUCTOR_CACHE_DIR).
///
/// The kind of the regular file at `rel` (relative to the cache root):
/// "fxgraph", "aotautograd", "kernels", "autotune", "timings", "cutedsl", "aoti_eager",
/// "memoizer", "dynamo", "triton" (content), "locks", "temp", "gate" (not content), or ""
/// (none of them writes such a path).
std::string CacheKindOf(const std::string& rel_path);

/// True for the kinds that are cache content (what export archives).
bool IsContentKind(const std::string& kind);

/// True if `rel` names a directory Inductor/Triton would create (a place
/// whose own files may be ours): the kind dirs and everything a kind's files
/// live in. Other directories are never removed, even when empty.
bool IsCacheDirPath(const std::string& rel_path);

/// True if Inductor, Triton or the gate would open `rel`: a layout dir, a
/// path shaped like one of their files, or anything under .dflash/. The
/// secure-tree check covers these (and only these: a cache_dir that is also
/// someone's home keeps its own links).
bool InductorReads(const std::string& rel_path);

}  // namespace dflash
