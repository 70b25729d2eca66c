#include <cctype>
#include <unistd.h>
#include <cstdio>

#include "common/exit_codes.h"
#include "launcher/plan/executable_check.h"
#include "launcher/plan/host_limits.h"
#include "launcher/commands/commands.h"
#include "launcher/plan/plan_format.h"
#include "launcher/plan/torch_version.h"
#include "store/redis_client.h"

namespace dflash {

EnvList EnvironmentList(char** env) {
  EnvList out;
  for (char** e = env; e && *e; ++e) {
    std::string s(*e);
    size_t eq = s.find('=');
    if (eq != std::string::npos) out.emplace_back(s.substr(0, eq), s.substr(eq + 1));
  }
  return out;
}

bool LoadConfigOrReport(const std::string& path, RunConfig* config) {
  std::vector<ConfigError> errors;
  if (LoadConfig(path, config, &errors)) return true;
  std::fputs(FormatErrors(errors).c_str(), stderr);
  return false;
}

bool CommandsRunOrReport(const RunConfig& config, char** env) {
  std::vector<ConfigError> errors = CheckCommands(config, EnvironmentList(env));
  if (errors.empty()) return true;
  std::fputs(FormatErrors(errors).c_str(), stderr);
  return false;
}

/// What the host adds to a plan: the GPUs (NVML, asked only when a GPU role runs on this node)
/// and each gated GPU role's CUDA/Triton versions (its GPU identity), and whether its Python loads the payload
/// hook (an unset gate.precompile follows it).
void AddHostFacts(const RunConfig& config, PlanOptions* po) {
  po->cuda_runtime = CudaRuntimeFor;
  po->payload_hook = PayloadHookFor;
  for (const RoleSpec& r : config.roles)
    if (!r.is_cpu() && r.RunsOnNode(po->node_rank)) {
      po->host_gpus = ProbeGpus();
      return;
    }
}

/// Precompile only where the payload hook checks what loads (CheckPrecompileHook); says why not, with the hint.
bool PrecompileHookOrReport(const RunConfig& config, const PlanOptions& po) {
  std::vector<ConfigError> errors = CheckPrecompileHook(config, po);
  if (errors.empty()) return true;
  std::fputs(FormatErrors(errors).c_str(), stderr);
  return false;
}

bool HostLimitsOrReport(const Plan& plan, char** env) {
  std::vector<ConfigError> errors = CheckHostLimits(plan, EnvironmentList(env), ReadHostLimits());
  if (errors.empty()) return true;
  std::fputs(FormatErrors(errors).c_str(), stderr);
  return false;
}

bool LoadPlanOrReport(const std::string& path, const std::string& run_id, const std::string& bin_dir, char** env,
                      Plan* plan) {
  RunConfig config;
  if (!LoadConfigOrReport(path, &config)) return false;
  PlanOptions po;
  po.run_id = run_id;
  po.bin_dir = bin_dir;
  po.torch_version = TorchVersionFor;
  po.launcher_env = EnvironmentList(env);
  AddHostFacts(config, &po);
  if (!PrecompileHookOrReport(config, po)) return false;
  *plan = BuildPlan(config, po);
  return true;
}

bool ValidRunId(const std::string& id) {
  if (id.empty() || id.size() > 128 || id == "." || id == "..") return false;
  for (char c : id)
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '.' && c != '_' && c != '-') return false;
  return true;
}

int PlanThisNode(const RunConfig& config, const NodeFlags& flags, const std::string& run_id,
                 const std::string& fallback_run_id, const std::string& bin_dir, char** env, Plan* plan) {
  EnvList env_list = EnvironmentList(env);
  NodeSetup setup;
  std::string err;
  if (!ResolveNodeSetup(flags, config.run, env_list, RunForOutput, &setup, &err)) {
    std::fprintf(stderr, "dflash-launch: %s\n", err.c_str());
    return exit_code::kUsage;
  }
  if (setup.node_rank >= setup.nnodes) {
    std::fprintf(stderr, "dflash-launch: node rank %d is not one of the %d nodes (0..%d)\n", setup.node_rank,
                 setup.nnodes, setup.nnodes - 1);
    return exit_code::kUsage;
  }
  if (!CheckPlacement(config, setup.nnodes, setup.node_rank, &err)) {
    std::fprintf(stderr, "dflash-launch: %s: %s\n", config.path.c_str(), err.c_str());
    return exit_code::kConfig;
  }
  PlanOptions po;
  po.run_id = run_id;
  // The scheduler's job id only where the nodes must agree: one node keeps a fresh id per
  // launch, so two runs in one batch script never share a run dir.
  if (po.run_id.empty() && !setup.run_id.empty() && setup.nnodes > 1) po.run_id = config.run.name + "-" + setup.run_id;
  // `check` shows the placeholder for any number of nodes; a run of several needs a shared id.
  if (po.run_id.empty() && (setup.nnodes == 1 || fallback_run_id == "<run_id>")) po.run_id = fallback_run_id;
  if (po.run_id.empty()) {
    std::fprintf(stderr,
                 "dflash-launch: this run spans %d nodes, and every node's launcher must use the same run id: "
                 "pass --run-id ID (under Slurm the job id is used)\n",
                 setup.nnodes);
    return exit_code::kUsage;
  }
  if (po.run_id != "<run_id>" && !ValidRunId(po.run_id)) {
    std::fprintf(stderr,
                 "dflash-launch: run id \"%s\" is not a directory name: use letters, digits, '.', '_' or '-' "
                 "(at most 128)\n",
                 po.run_id.c_str());
    return exit_code::kUsage;
  }
  po.bin_dir = bin_dir;
  po.torch_version = TorchVersionFor;
  po.launcher_env = std::move(env_list);
  po.nnodes = setup.nnodes;
  po.node_rank = setup.node_rank;
  po.master_addr = setup.master_addr;
  po.master_port = setup.master_port;
  if (!flags.store.empty() && flags.store != "private") {
    StoreUrl url;
    if (!ParseStoreUrl(flags.store, &url, &err)) {
      std::fprintf(stderr, "dflash-launch: --store: %s\n", err.c_str());
      return exit_code::kUsage;
    }
  }
  po.store = flags.store;
  AddHostFacts(config, &po);
  if (!PrecompileHookOrReport(config, po)) return exit_code::kConfig;
  *plan = BuildPlan(config, po);
  bool gpu_here = false;
  for (const ProcessPlan& p : plan->processes) gpu_here |= p.on_gpu();
  // NVML is asked only where a GPU process runs; without it the count is not checked (said once).
  if (gpu_here && !plan->host_gpus.nvml)
    std::fprintf(stderr, "dflash-launch: NVML: %s: the GPU count and models are not checked\n",
                 plan->host_gpus.why_not.c_str());
  if (!CheckDevices(*plan, plan->host_gpus.nvml ? static_cast<int>(plan->host_gpus.gpus.size()) : -1, &err)) {
    std::fprintf(stderr, "dflash-launch: %s: %s\nnothing was started.\n", config.path.c_str(), err.c_str());
    return exit_code::kConfig;
  }
  return exit_code::kOk;
}

bool BuiltinInstalledOrReport(const RunConfig& config, const std::string& bin_dir, bool warn_only) {
  std::string path = bin_dir + "/dflash-builtin";
  if (::access(path.c_str(), X_OK) == 0) return true;
  for (const RoleSpec& r : config.roles) {
    if (r.builtin.empty()) continue;
    std::fprintf(stderr,
                 "%s: %s: role[%s].builtin: dflash-builtin is not installed beside dflash-launch (%s)\n"
                 "    hint: builtin roles need a source build (`make build`, against your torch's LibTorch); the pip "
                 "wheel leaves dflash-builtin out (docs/wheel.md). Or give the role a command.\n",
                 r.pos.ToString().c_str(), warn_only ? "warning" : "error", r.name.c_str(), path.c_str());
    if (!warn_only) std::fputs("nothing was started.\n", stderr);
    return warn_only;
  }
  return true;
}

int RunCheck(const CheckOptions& opts, char** env) {
  RunConfig config;
  if (!LoadConfigOrReport(opts.config, &config)) return exit_code::kConfig;
  Plan plan;
  if (int rc = PlanThisNode(config, opts.nodes, opts.run_id, "<run_id>", opts.bin_dir, env, &plan); rc != 0)
    return rc;
  BuiltinInstalledOrReport(config, opts.bin_dir, /*warn_only=*/true);
  std::fputs(FormatWarnings(ConfigWarnings(config)).c_str(), stderr);
  if (!CommandsRunOrReport(plan.config, env)) return exit_code::kConfig;
  // With a run id: its run dir, as `run` will check it (another user's link or dir there is refused).
  if (!opts.run_id.empty()) {
    std::string err;
    if (!CheckSecurePath(plan.run_dir, RunDirUse(), &err)) {
      std::fprintf(stderr, "%s: run.log_dir: %s\n", config.path.c_str(), err.c_str());
      return exit_code::kConfig;
    }
  }
  if (!HostLimitsOrReport(plan, env)) return exit_code::kConfig;
  std::fputs((opts.json ? PlanJson(plan) : PlanText(plan)).c_str(), stdout);
  return exit_code::kOk;
}

}  // namespace dflash
