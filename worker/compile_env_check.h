// What a gated payload's processes really run with, checked where it takes effect: in each process of its tree
// (/proc/<pid>/environ) and in what the payload's own torch reports, not only in the config's env tables.
//
// Two settings decide whether a process may share the gate's cache (docs/cachelock.md, "What is exact"):
// Dynamo's precompile cache must be off (TORCH_CACHING_PRECOMPILE=1 drops identity guards in the live process:
// wrong values), and the process's Inductor keys must carry the CPU it compiles for (TORCH_COMPILE_CACHE_KEY_TAG
// with this host's CPU and its ATEN_CPU_CAPABILITY: common/cpu_identity.h). A wrapper (`env VAR=1 python ...`,
// `sh -c 'VAR=1 python ...'`) or the script itself can change either after the plan was checked.
#pragma once

#include <sys/types.h>

#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace dflash {

/// What the gate shares entries under: the payload's environment as the worker gave it.
struct CompileEnvExpect {
  std::string cache_key_tag;                       ///< TORCH_COMPILE_CACHE_KEY_TAG
  std::optional<std::string> aten_cpu_capability;  ///< ATEN_CPU_CAPABILITY (nullopt: unset)
};

/// Why an environment (NUL-separated "K=V" entries, as /proc/<pid>/environ holds them) would not compute what the
/// gate promises, or "" when it would: Dynamo's precompile on; or, in a process with a tag (one that shares the
/// gate's entries: a tool run with an environment of its own has none), another tag or another ATEN_CPU_CAPABILITY.
std::string CompileEnvProblem(std::string_view environ_block, const CompileEnvExpect& want);

/// The first process of `root`'s tree (common/proc_scan.h ProcessTree) whose environment has a
/// CompileEnvProblem: "pid 1234 (python3): TORCH_CACHING_PRECOMPILE=1 ...", or "". A process whose environ
/// cannot be read (gone, another user's) is skipped: it cannot be judged, and one that is gone computes nothing.
std::string ForeignCompileEnv(pid_t root, const CompileEnvExpect& want);

/// What the payload's own torch reported with its notify (dflash_launch.notify: X_DFLASH_PRECOMPILE,
/// X_DFLASH_CACHE_KEY_TAG, X_DFLASH_CPU_CAPABILITY), judged the same way: "" when it agrees or said nothing.
struct ReportedCompileFacts {
  std::optional<std::string> precompile;      ///< "1" or "0"
  std::optional<std::string> cache_key_tag;
  std::optional<std::string> cpu_capability;  ///< "-": unset
};
std::string ReportedCompileProblem(const ReportedCompileFacts& reported, const CompileEnvExpect& want);

}  // namespace dflash
