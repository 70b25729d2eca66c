// What every command does before it acts (docs/design.md, "Layers"): read the config, check that its commands
// run, place this launcher among the nodes, plan, and check the plan against this host. Each step returns a
// Status; the command says it once (Say) and exits with its code, so no helper prints or exits on its own.
#include <cctype>
#include <unistd.h>
#include <cstdio>

#include "common/exit_codes.h"
#include "launcher/plan/executable_check.h"
#include "launcher/plan/host_limits.h"
#include "launcher/commands/front_door.h"
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

Status LoadConfigFile(const std::string& path, RunConfig* config) {
  std::vector<ConfigError> errors;
  if (LoadConfig(path, config, &errors)) return Status::Ok();
  return Status::Error(exit_code::kConfig, FormatErrors(errors));
}

Status CommandsRun(const RunConfig& config, char** env) {
  std::vector<ConfigError> errors = CheckCommands(config, EnvironmentList(env));
  return errors.empty() ? Status::Ok() : Status::Error(exit_code::kConfig, FormatErrors(errors));
}

/// What the host adds to a plan: the GPUs (NVML, asked only when a GPU role runs on this node)
/// and each gated GPU role's CUDA/Triton versions (its GPU identity).
void AddHostFacts(const RunConfig& config, PlanOptions* po) {
  po->cuda_runtime = CudaRuntimeFor;
  for (const RoleSpec& r : config.roles)
    if (!r.is_cpu() && r.RunsOnNode(po->node_rank)) {
      po->host_gpus = ProbeGpus();
      return;
    }
}

/// No gated process runs with Dynamo's precompile cache (CheckNoPrecompile).
Status NoPrecompile(const RunConfig& config, const PlanOptions& po) {
  std::vector<ConfigError> errors = CheckNoPrecompile(config, po);
  return errors.empty() ? Status::Ok() : Status::Error(exit_code::kConfig, FormatErrors(errors));
}

Status HostLimitsFit(const Plan& plan, char** env) {
  std::vector<ConfigError> errors = CheckHostLimits(plan, EnvironmentList(env), ReadHostLimits());
  return errors.empty() ? Status::Ok() : Status::Error(exit_code::kConfig, FormatErrors(errors));
}

Status LoadPlan(const std::string& path, const std::string& run_id, const std::string& bin_dir, char** env,
                Plan* plan) {
  RunConfig config;
  if (Status s = LoadConfigFile(path, &config); !s.ok()) return s;
  PlanOptions po;
  po.run_id = run_id;
  po.bin_dir = bin_dir;
  po.torch_version = TorchVersionFor;
  po.launcher_env = EnvironmentList(env);
  AddHostFacts(config, &po);
  if (Status s = NoPrecompile(config, po); !s.ok()) return s;
  *plan = BuildPlan(config, po);
  return Status::Ok();
}

bool ValidRunId(const std::string& id) {
  if (id.empty() || id.size() > 128 || id == "." || id == "..") return false;
  for (char c : id)
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '.' && c != '_' && c != '-') return false;
  return true;
}

Status PlanThisNode(const RunConfig& config, const NodeFlags& flags, const std::string& run_id,
                    const std::string& fallback_run_id, const std::string& bin_dir, char** env, Plan* plan) {
  EnvList env_list = EnvironmentList(env);
  NodeSetup setup;
  std::string err;
  if (!ResolveNodeSetup(flags, config.run, env_list, RunForOutput, &setup, &err)) {
    return Status::Error(exit_code::kUsage, "dflash-launch: " + err + "\n");
  }
  if (setup.node_rank >= setup.nnodes) {
    return Status::Error(exit_code::kUsage, "dflash-launch: node rank " + std::to_string(setup.node_rank) +
                                                " is not one of the " + std::to_string(setup.nnodes) + " nodes (0.." +
                                                std::to_string(setup.nnodes - 1) + ")\n");
  }
  if (!CheckPlacement(config, setup.nnodes, setup.node_rank, &err)) {
    return Status::Error(exit_code::kConfig, "dflash-launch: " + config.path + ": " + err + "\n");
  }
  PlanOptions po;
  po.run_id = run_id;
  // The scheduler's job id only where the nodes must agree: one node keeps a fresh id per
  // launch, so two runs in one batch script never share a run dir.
  if (po.run_id.empty() && !setup.run_id.empty() && setup.nnodes > 1) po.run_id = config.run.name + "-" + setup.run_id;
  // `check` shows the placeholder for any number of nodes; a run of several needs a shared id.
  if (po.run_id.empty() && (setup.nnodes == 1 || fallback_run_id == "<run_id>")) po.run_id = fallback_run_id;
  if (po.run_id.empty()) {
    return Status::Error(exit_code::kUsage, "dflash-launch: this run spans " + std::to_string(setup.nnodes) +
                                                " nodes, and every node's launcher must use the same run id: pass "
                                                "--run-id ID (under Slurm the job id is used)\n");
  }
  if (po.run_id != "<run_id>" && !ValidRunId(po.run_id)) {
    return Status::Error(exit_code::kUsage, "dflash-launch: run id \"" + po.run_id +
                                                "\" is not a directory name: use letters, digits, '.', '_' or '-' "
                                                "(at most 128)\n");
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
      return Status::Error(exit_code::kUsage, "dflash-launch: --store: " + err + "\n");
    }
  }
  po.store = flags.store;
  AddHostFacts(config, &po);
  if (Status s = NoPrecompile(config, po); !s.ok()) return s;
  *plan = BuildPlan(config, po);
  bool gpu_here = false;
  for (const ProcessPlan& p : plan->processes) gpu_here |= p.on_gpu();
  // NVML is asked only where a GPU process runs; without it the count is not checked (said once).
  if (gpu_here && !plan->host_gpus.nvml)
    std::fprintf(stderr, "dflash-launch: NVML: %s: the GPU count and models are not checked\n",
                 plan->host_gpus.why_not.c_str());
  if (!CheckDevices(*plan, plan->host_gpus.nvml ? static_cast<int>(plan->host_gpus.gpus.size()) : -1, &err)) {
    return Status::Error(exit_code::kConfig, "dflash-launch: " + config.path + ": " + err + "\nnothing was started.\n");
  }
  return Status::Ok();
}

Status BuiltinInstalled(const RunConfig& config, const std::string& bin_dir, bool warn_only) {
  std::string path = bin_dir + "/dflash-builtin";
  if (::access(path.c_str(), X_OK) == 0) return Status::Ok();
  for (const RoleSpec& r : config.roles) {
    if (r.builtin.empty()) continue;
    return Status::Error(
        exit_code::kConfig,
        r.pos.ToString() + ": " + (warn_only ? "warning" : "error") + ": role[" + r.name +
            "].builtin: dflash-builtin is not installed beside dflash-launch (" + path +
            ")\n    hint: builtin roles need a source build (`make build`, against your torch's LibTorch); the pip "
            "wheel leaves dflash-builtin out (docs/wheel.md). Or give the role a command.\n" +
            (warn_only ? "" : "nothing was started.\n"));
  }
  return Status::Ok();
}

int Say(const Status& s) {
  if (!s.message().empty()) std::fputs(s.message().c_str(), stderr);
  return s.exit_code();
}

}  // namespace dflash
