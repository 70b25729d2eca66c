#include "worker/compile_env_check.h"

#include "common/proc_info.h"
#include "common/proc_scan.h"
#include "contract/env_vars.h"

namespace dflash {
namespace {

std::optional<std::string> Lookup(std::string_view block, std::string_view name) {
  std::optional<std::string> found;
  size_t at = 0;
  while (at < block.size()) {
    size_t end = block.find('\0', at);
    std::string_view entry = block.substr(at, end == std::string_view::npos ? std::string_view::npos : end - at);
    at = end == std::string_view::npos ? block.size() : end + 1;
    if (entry.size() > name.size() && entry.substr(0, name.size()) == name && entry[name.size()] == '=')
      found = std::string(entry.substr(name.size() + 1));  // the last one: what Python's os.environ keeps
  }
  return found;
}

std::string Shown(const std::optional<std::string>& v) { return v ? "\"" + *v + "\"" : std::string("unset"); }

}  // namespace

std::string CompileEnvProblem(std::string_view block, const CompileEnvExpect& want) {
  if (Lookup(block, env::kTorchCachingPrecompile) == std::optional<std::string>("1"))
    return std::string(env::kTorchCachingPrecompile) + "=1: Dynamo's precompile cache computes wrong values in a "
           "gated process (torch drops identity guards); unset it where it is set (a wrapper such as `env`, a shell "
           "line, the script)";
  // A process without any tag (a tool the payload runs with an environment of its own) shares none of the gate's
  // entries: nothing to judge. One with a tag shares them, so its tag and its ISA must be the gate's.
  std::optional<std::string> tag = Lookup(block, env::kTorchCompileCacheKeyTag);
  if (!tag) return "";
  if (*tag != want.cache_key_tag)
    return std::string(env::kTorchCompileCacheKeyTag) + " is " + Shown(tag) + ", not " + Shown(want.cache_key_tag) +
           ": the gate's processes share entries only under the tag that names their CPU; set your own tag in the "
           "role's env (dflash-launch keeps it and adds the CPU's)";
  std::optional<std::string> cap = Lookup(block, env::kAtenCpuCapability);
  if (cap != want.aten_cpu_capability)
    return std::string(env::kAtenCpuCapability) + " is " + Shown(cap) + " where the gate's processes run with " +
           Shown(want.aten_cpu_capability) + ": it picks the vector ISA Inductor compiles for, and this process's "
           "cache keys were made for the other one; set it in the role's env (it is then in the gate key and "
           "every key) instead of a wrapper";
  return "";
}

std::string ForeignCompileEnv(pid_t root, const CompileEnvExpect& want) {
  std::string block;
  for (pid_t pid : ProcessTree(root)) {
    if (!ReadProcEnviron(pid, &block)) continue;
    if (std::string why = CompileEnvProblem(block, want); !why.empty())
      return "pid " + std::to_string(pid) + " (" + ProcessName(pid) + "): " + why;
  }
  return "";
}

std::string ReportedCompileProblem(const ReportedCompileFacts& reported, const CompileEnvExpect& want) {
  const auto& [precompile, cache_key_tag, cpu_capability] = reported;
  if (precompile == std::optional<std::string>("1"))
    return "its torch runs with torch._dynamo.config.caching_precompile = True: Dynamo's precompile cache computes "
           "wrong values in a gated process (torch drops identity guards); do not turn it on";
  if (cache_key_tag && *cache_key_tag != want.cache_key_tag)
    return "its torch runs with torch.compiler.config.cache_key_tag = \"" + *cache_key_tag + "\", not \"" +
           want.cache_key_tag + "\": the gate's processes share entries only under the tag that names their CPU; "
           "set your own tag in the role's env (dflash-launch keeps it and adds the CPU's)";
  if (cpu_capability) {
    std::optional<std::string> cap = *cpu_capability == "-" ? std::nullopt : cpu_capability;
    if (cap != want.aten_cpu_capability)
      return std::string("its os.environ has ") + env::kAtenCpuCapability + " " + Shown(cap) + " where the gate's "
             "processes run with " + Shown(want.aten_cpu_capability) + ": Inductor picks its vector ISA by it, and "
             "this process's cache keys were made for the other one; set it in the role's env instead of the script";
  }
  return "";
}

}  // namespace dflash
