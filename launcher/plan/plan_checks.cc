// What refuses a plan before anything is spawned: a placement the nodes cannot
// hold, devices the host or the launcher's CUDA_VISIBLE_DEVICES do not have,
// Dynamo's precompile cache in a gated process.
#include <algorithm>
#include <cctype>

#include "common/split.h"
#include "contract/env_vars.h"
#include "launcher/plan/plan.h"

namespace dflash {

std::vector<ConfigError> CheckNoPrecompile(const RunConfig& config, const PlanOptions& options) {
  std::vector<ConfigError> errors;
  for (const RoleSpec& role : config.roles) {
    if (!role.gate.enabled || !role.builtin.empty() || !role.RunsOnNode(options.node_rank)) continue;
    std::string where, key = "role[" + role.name + "].env." + env::kTorchCachingPrecompile;
    SourcePos pos = role.pos;
    for (size_t i = 0; i < role.env.size() && where.empty(); ++i)
      if (role.env[i].first == env::kTorchCachingPrecompile && role.env[i].second == "1") {
        where = "the role's env";
        pos = i < role.env_pos.size() ? role.env_pos[i] : role.pos;
      }
    for (const auto& [k, v] : options.launcher_env)
      if (where.empty() && k == env::kTorchCachingPrecompile && v == "1") where = "the launcher's environment";
    if (where.empty()) continue;
    errors.push_back({pos, key,
                      "Dynamo's precompile cache computes wrong values in a gated process: torch drops identity "
                      "guards in the live process (a second callable, an Enum member, a rebound global run the "
                      "first one's code) and shares entries keyed by a function's name, not by what it traced",
                      std::string(env::kTorchCachingPrecompile) + " unset or 0 in every gated process",
                      std::string(env::kTorchCachingPrecompile) + "=1 in " + where,
                      "unset it: every process traces for itself and loads the shared FX-graph, AOTAutograd and "
                      "Inductor caches (docs/cachelock.md, \"What is exact\")"});
  }
  return errors;
}

bool CheckPlacement(const RunConfig& config, int nnodes, int node_rank, std::string* err) {
  if (nnodes < 1) {
    *err = "nnodes must be at least 1 (got " + std::to_string(nnodes) + ")";
    return false;
  }
  if (node_rank < 0 || node_rank >= nnodes) {
    *err = "node rank " + std::to_string(node_rank) + " is not one of the " + std::to_string(nnodes) +
           " nodes (0.." + std::to_string(nnodes - 1) + ")";
    return false;
  }
  if (config.run.nnodes > 0 && config.run.nnodes != nnodes) {
    *err = "[run] nnodes = " + std::to_string(config.run.nnodes) + " but this launcher is one of " +
           std::to_string(nnodes) + " nodes (from the flags or the scheduler); make them agree or remove the key";
    return false;
  }
  bool node0 = false, here = false;
  for (const RoleSpec& r : config.roles) {
    for (int n : r.nodes)
      if (n >= nnodes) {
        *err = "role " + r.name + " is pinned to node " + std::to_string(n) + " but the run has " +
               std::to_string(nnodes) + " node" + (nnodes == 1 ? "" : "s") + " (ranks 0.." +
               std::to_string(nnodes - 1) + "): fix nodes = [...] or --nnodes";
        return false;
      }
    node0 |= r.RunsOnNode(0);
    here |= r.RunsOnNode(node_rank);
  }
  if (!node0) {
    *err = "no role runs on node 0, which hosts rank 0 and MASTER_ADDR: pin a role to node 0";
    return false;
  }
  if (!here) {
    *err = "no role runs on node " + std::to_string(node_rank) +
           ": this launcher would start nothing (check the roles' nodes = [...] and --nnodes)";
    return false;
  }
  return true;
}

std::vector<std::string> SplitVisibleDevices(const std::string& value) {
  std::vector<std::string> out = SplitOn(value, ',');
  for (std::string& e : out) {  // " 0, 1" as "0", "1"
    size_t b = e.find_first_not_of(' ');
    e = b == std::string::npos ? std::string() : e.substr(b, e.find_last_not_of(' ') - b + 1);
  }
  return out;
}

bool CheckDevices(const Plan& plan, int gpu_count, std::string* err) {
  std::vector<std::string> inherited = plan.inherited_visible_devices.empty()
                                           ? std::vector<std::string>{}
                                           : SplitVisibleDevices(plan.inherited_visible_devices);
  for (const RoleSpec& r : plan.config.roles) {
    if (!r.RunsOnNode(plan.node_rank)) continue;
    for (size_t i = 0; i < r.devices.size(); ++i) {
      const std::string name = r.DeviceName(i);
      const std::string where = r.name + ".devices[" + std::to_string(i) + "] = " + name;
      if (r.devices[i] < 0) {  // a UUID: CUDA takes it as it is, unless the launcher's list leaves it out
        bool listed = inherited.empty() || std::find(inherited.begin(), inherited.end(), name) != inherited.end();
        bool indices = !inherited.empty() && std::isdigit(static_cast<unsigned char>(inherited[0][0]));
        if (!listed && !indices) {
          *err = "role " + where + " is not in the launcher's CUDA_VISIBLE_DEVICES=" +
                 plan.inherited_visible_devices + ": use one of those GPUs (or its index in that list)";
          return false;
        }
        continue;
      }
      size_t idx = static_cast<size_t>(r.devices[i]);
      if (!inherited.empty() && idx >= inherited.size()) {
        *err = "role " + where + ", but the launcher's CUDA_VISIBLE_DEVICES=" + plan.inherited_visible_devices +
               " leaves " + std::to_string(inherited.size()) + " GPU" + (inherited.size() == 1 ? "" : "s") +
               " (indices 0.." + std::to_string(inherited.size() - 1) +
               "): devices index into that list (the scheduler's or container's GPUs)";
        return false;
      }
      std::string physical = inherited.empty() ? name : inherited[idx];
      bool numeric = !physical.empty() && std::all_of(physical.begin(), physical.end(), ::isdigit);
      if (numeric && gpu_count >= 0 && std::stoi(physical) >= gpu_count) {
        *err = "role " + where + (inherited.empty() ? "" : " (GPU " + physical + " of CUDA_VISIBLE_DEVICES)") +
               ", but this host has " + std::to_string(gpu_count) + " GPU" +
               (gpu_count == 1 ? "" : "s") + (gpu_count ? " (indices 0.." + std::to_string(gpu_count - 1) + ")" : "") +
               " (NVML): use an index below " + std::to_string(gpu_count) + ", or cpu = N";
        return false;
      }
    }
  }
  return true;
}

}  // namespace dflash
