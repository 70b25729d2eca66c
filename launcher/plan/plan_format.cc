#include "launcher/plan/plan_format.h"

#include "launcher/config/role_order.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <map>
#include <set>

#include "common/duration.h"
#include "common/redact.h"
#include "common/signal_names.h"
#include "contract/env_vars.h"
#include "contract/shape_contract.h"

namespace dflash {
namespace {

using ojson = nlohmann::ordered_json;

std::string Join(const std::vector<std::string>& v, const char* sep = " ") {
  std::string s;
  for (size_t i = 0; i < v.size(); ++i) s += (i ? sep : "") + v[i];
  return s;
}

std::string Devices(const RoleSpec& r) {
  if (r.is_cpu()) return std::to_string(r.cpu) + " on cpu";
  std::vector<std::string> d;
  for (size_t i = 0; i < r.devices.size(); ++i) d.push_back(r.DeviceName(i));
  return std::to_string(r.devices.size()) + " on GPU " + Join(d, ",");
}

// What `check` shows of a value: a secret's never (common/redact.h); the launcher's own variables are
// not secrets whatever their names say (DFLASH_GATE_KEY, DFLASH_STORE_SECRET_FILE is a path), though a
// URL's password is hidden in any.
std::string Shown(const std::string& name, const std::string& value) {
  return env::IsOwnedVar(name) ? RedactUrlCredentials(value) : RedactEnvValue(name, value);
}

/// The text plan shows a value on one line: a list of lines (a variable a role sets to several lines, say: one
/// `<sha256> <path>` each) becomes its count; `check --json` has it whole.
std::string OneLine(const std::string& name, const std::string& value) {
  if (value.find('\n') == std::string::npos) return Shown(name, value);
  size_t lines = static_cast<size_t>(std::count(value.begin(), value.end(), '\n')) + (value.back() != '\n');
  return "<" + std::to_string(lines) + " lines: check --json shows them>";
}

std::string Quoted(const std::string& name, const std::string& value) {
  return value.empty() ? "\"\"" : OneLine(name, value);
}

/// The files of a derived gate key in one line (their hashes: `check --json`), plus a line for each file that
/// could not be hashed: a missing one is what the reader must see.
std::string KeyFilesText(const std::vector<KeyFile>& files, const std::string& indent) {
  std::string o;
  std::vector<const KeyFile*> hashed;
  for (const KeyFile& f : files) {
    if (!f.sha256.empty()) hashed.push_back(&f);
    else o += indent + "key file " + f.why + ": " + (f.path.empty() ? "" : f.path + " ") + "(" + f.note + ")\n";
  }
  if (hashed.empty()) return o;
  std::string head = hashed[0]->why + " (" + hashed[0]->path + ")";
  if (hashed.size() == 1) return indent + "key file " + head + "\n" + o;
  return indent + "key files " + std::to_string(hashed.size()) + ": " + head + " and " +
         std::to_string(hashed.size() - 1) + " more it imports or names (check --json lists each with its sha256)\n" +
         o;
}

std::string Pad(std::string s, size_t n) {
  s.append(s.size() < n ? n - s.size() : 1, ' ');  // a long name still gets its separating space
  return s;
}

}  // namespace

std::string ShownEnvValue(const std::string& name, const std::string& value) { return Shown(name, value); }

std::string DescribeRestart(const RestartSpec& r) {
  if (r.policy == RestartPolicy::kNever) return "never";
  std::string s = std::string(RestartPolicyName(r.policy)) + " (scope " + RestartScopeName(r.scope) + ", max " +
                  std::to_string(r.max) + " in " + FormatDuration(r.window) + ", backoff " +
                  FormatDuration(r.backoff_min) + ".." + FormatDuration(r.backoff_max) + ", reset after " +
                  FormatDuration(r.reset_after);
  if (!r.no_restart_exit_codes.empty()) {
    std::vector<std::string> c;
    for (int e : r.no_restart_exit_codes) c.push_back(std::to_string(e));
    s += ", never for exit " + Join(c, ",");
  }
  return s + ")";
}

std::string DescribeReady(const ReadySpec& r) {
  std::string s = ReadyModeName(r.mode);
  if (r.mode == ReadyMode::kLog) s += " /" + r.arg + "/";
  if (r.mode == ReadyMode::kFile) s += " " + r.arg;
  if (r.probes()) s += " " + r.probe.Describe().substr(r.mode == ReadyMode::kTcp ? 4 : 0) + " every " +
                       FormatDuration(r.probe.interval);
  if (r.mode != ReadyMode::kNone) s += " (timeout " + FormatDuration(r.timeout) + ")";
  return s;
}

namespace {

/// The run: its dirs, master, nodes, signals, store and password source.
std::string RunText(const Plan& plan) {
  const RunConfig& c = plan.config;
  std::string o;
  o += "plan for " + c.path + "\n";
  o += "  run      " + c.run.name + " (run id " + plan.run_id + ", " + std::to_string(plan.processes.size()) +
       " processes)\n";
  o += "  cache    " + c.run.cache_dir + "  (TORCHINDUCTOR_CACHE_DIR; the gate is in .dflash/)\n";
  o += "  logs     " + plan.run_dir + "\n";
  o += "  spool    " + c.run.spool_dir + "\n";
  o += "  master   " + plan.master_addr + ":" +
       (plan.master_port ? std::to_string(plan.master_port) : std::string("<auto>")) +
       (c.run.master_port == 0 ? "  (master_port = \"auto\": " +
                                     std::string(plan.nnodes > 1 ? "derived from the run id" : "a free port per run") +
                                     ")"
                               : std::string()) +
       "\n";
  if (plan.nnodes > 1)
    o += "  node     " + std::to_string(plan.node_rank) + " of " + std::to_string(plan.nnodes) + " (" +
         std::to_string(plan.local_world_size) + " of the " + std::to_string(plan.world_size) +
         " processes here; ranks are global)\n";
  if (!c.run.forward_signals.empty()) {
    std::vector<std::string> s;
    for (int sig : c.run.forward_signals) s.push_back(SignalName(sig));
    o += "  forward  " + Join(s, ", ") + "\n";
  }
  if (!c.run.stop_signals.empty()) {
    std::vector<std::string> s;
    for (int sig : c.run.stop_signals) s.push_back(SignalName(sig));
    o += "  stop on  " + Join(s, ", ") + " (as SIGTERM: every process checkpoints within its stop.grace)\n";
  }
  if (!plan.store.empty())
    o += "  store    " + plan.StoreUrlText() +
         (plan.store_private() ? "  (private: node 0's launcher starts a redis-server for the run)" : "") +
         "  (ttl " + FormatDuration(c.run.store_ttl) + ")\n";
  // Where the password comes from, never the password (it is read only at run time).
  if (!plan.store.empty()) {
    std::string user = c.run.store_user.empty() ? "" : ", user " + c.run.store_user;
    if (!c.run.store_password_file.empty())
      o += "  password from " + c.run.store_password_file + " (not shown)" + user + "\n";
    else if (!c.run.store_password_env.empty())
      o += "  password from $" + c.run.store_password_env + " (not shown)" + user + "\n";
    else if (plan.store_private() && plan.nnodes > 1)
      o += "  password MISSING: a private store of several nodes needs [run] store_password_file or "
           "store_password_env (`run` exits 64)\n";
    else if (plan.store_private())
      o += "  password random, drawn by node 0's launcher (not shown)\n";
    else
      o += "  password none (the store must not need one)\n";
  }
  if (c.run.share_gpus) o += "  gpus     shared: several processes may use one GPU ([run] share_gpus)\n";
  return o;
}

/// The [model] shape contract, if any.
std::string ContractText(const ModelSpec& m) {
  std::string o;
  if (m.present) {
    std::vector<int64_t> taps(m.tapped_layers.begin(), m.tapped_layers.end());
    o += "\nshape contract\n";
    o += "  target   " + std::to_string(m.target_layers) + " layers, hidden " + std::to_string(m.hidden) +
         ", taps [" + JoinInts(taps, ", ") + "]" + (m.tapped_layers_derived ? " (derived)" : "") + "\n";
    o += "  drafter  input " + ShapeString(m.HiddenShape()) + " = [batch, seq_len, " + std::to_string(m.NumTaps()) +
         "*" + std::to_string(m.hidden) + "], taps concatenated on the feature axis\n";
    o += "           fc " + std::to_string(m.NumTaps() * static_cast<int64_t>(m.hidden)) + " -> " +
         std::to_string(m.hidden) + ", " + std::to_string(m.draft_layers) + " draft layers, block " +
         std::to_string(m.block_size) + ", " + m.dtype + (m.heads ? ", " + std::to_string(m.heads) + " heads" : "") +
         (m.kv_heads ? " / " + std::to_string(m.kv_heads) + " kv" : "") + "\n";
  }
  return o;
}

/// Role `i`: its devices and command, gate, warm-up, stack, ports, readiness, restarts, stop, world, watchdog.
std::string RoleText(const Plan& plan, size_t i) {
  const RunConfig& c = plan.config;
  std::string o;
  const RoleSpec& r = c.roles[i];
  std::string where;
  if (plan.nnodes > 1) {
    std::vector<std::string> nodes;
    for (int n = 0; n < plan.nnodes; ++n)
      if (r.RunsOnNode(n)) nodes.push_back(std::to_string(n));
    where = " per node on node" + std::string(nodes.size() > 1 ? "s " : " ") + Join(nodes, ",") +
            (r.RunsOnNode(plan.node_rank) ? "" : " (not this one)");
  }
  o += "  " + Pad(r.name, 10) + Devices(r) + where + ", " +
       (r.builtin.empty() ? "command: " + Join(RedactArgv(r.command)) : "builtin " + r.builtin) + "\n";
  std::string key;
  for (const ProcessPlan& p : plan.processes)
    if (p.role_index == i) key = p.gate_key;
  o += "  " + Pad("", 10) + "gate     " +
       (r.gate.enabled ? key + (r.gate.key.empty() ? " (derived)" : "") + ", mode " + GateModeName(r.gate_mode()) +
                             (r.gate.mode == GateMode::kAuto ? " (auto)" : "") + ", wait up to " +
                             FormatDuration(r.gate.timeout)
                       : std::string("off")) +
       "\n";
  o += KeyFilesText(plan.roles[i].key_files, "  " + Pad("", 10) + "  ");
  if (r.warmup_gated())
    o += "  " + Pad("", 10) + "warm-up  " + r.name + ":warmup compiles first, in a world of one (RANK=0 WORLD_SIZE=1 "
         "ROLE_WORLD_SIZE=1 DFLASH_WARMUP=1, its own MASTER_PORT): " +
         Join(RedactArgv(r.warmup.empty() ? (r.builtin.empty() ? r.command
                                                               : std::vector<std::string>{"dflash-builtin", r.builtin})
                                          : r.warmup)) +
         "; stopped once ready; " +
         (r.gate_hold() == GateHold::kOne
              ? "its first process waits for it (hold one), the others start at once and wait for that one in "
                "init_process_group\n"
              : "then the role's " + std::to_string(r.process_count()) + " processes start together\n");
  if (r.service)
    o += "  " + Pad("", 10) + "service  starts before the other roles, stops after them; its end is a failure\n";
  if (!r.starts_after.empty()) {
    std::vector<std::string> deps;
    for (size_t d : r.starts_after) deps.push_back(c.roles[d].name);
    o += "  " + Pad("", 10) + "after    " + Join(deps, ", ") + " (starts once all of their processes are ready)\n";
  }
  if (!r.ports.empty()) {
    std::vector<std::string> names;
    for (const std::string& n : r.ports)
      names.push_back(n + " (" + env::PortVar(n) + ", all: " + env::RolePortsVar(r.name, n) + ")");
    o += "  " + Pad("", 10) + "ports    " + Join(names, ", ") +
         ": one free port per process, reserved for the whole run" +
         (plan.nnodes > 1 ? "; the lists hold this node's processes only" : "") + "\n";
  }
  o += "  " + Pad("", 10) + "ready    " + DescribeReady(r.ready) + "\n";
  o += "  " + Pad("", 10) + "restart  " + DescribeRestart(r.restart) + "\n";
  o += "  " + Pad("", 10) + "stop     " + SignalName(r.stop.signal) + ", then SIGKILL after " +
       FormatDuration(r.stop.grace) + "\n";
  if (r.world != TorchWorld::kNone)
    o += "  " + Pad("", 10) + "world    " + TorchWorldName(r.world) +
         " (one torch world: its processes restart together)\n";
  if (r.watchdog.count() > 0)
    o += "  " + Pad("", 10) + "watchdog " + FormatDuration(r.watchdog) + ", then " + SignalName(r.watchdog_signal) +
         " (hung: no WATCHDOG=1, or no output/STATUS= from one that never sent it)\n";
  if (r.liveness.enabled)
    o += "  " + Pad("", 10) + "liveness " + r.liveness.probe.Describe() + " every " +
         FormatDuration(r.liveness.probe.interval) + ", hung after " + std::to_string(r.liveness.failures) +
         " failed tries, then " + SignalName(r.watchdog_signal) + "\n";
  if (r.gate.enabled) o += "  " + Pad("", 10) + "torch    " + plan.roles[i].torch_version + " (in the gate key)\n";
  if (r.gate.enabled && !plan.roles[i].gpu_identity.empty())
    o += "  " + Pad("", 10) + "gpu      " + plan.roles[i].gpu_identity + " (in the gate key, READY and exports)\n";
  if (r.gate.enabled && !plan.roles[i].cpu_identity.empty())
    o += "  " + Pad("", 10) + "cpu      " + plan.roles[i].cpu_identity + " (in the gate key, READY, exports and " +
         "Inductor's keys: " + plan.roles[i].cache_key_tag + ")\n";
  return o;
}

/// The environment, what all processes share once; the warm-ups' differences; and the process list with what
/// differs per process.
std::string EnvironmentAndProcessesText(const Plan& plan) {
  std::string o;
  // The environment: what all processes share once, then what differs.
  std::vector<EnvList> envs;
  for (const ProcessPlan& p : plan.processes) envs.push_back(plan.ProcessEnv(p, 0));
  std::map<std::string, std::set<std::string>> values;
  std::map<std::string, size_t> count;
  for (const EnvList& e : envs)
    for (const auto& [k, v] : e) {
      values[k].insert(v);
      ++count[k];
    }
  auto shared = [&](const std::string& k) { return values[k].size() == 1 && count[k] == envs.size(); };
  o += "\nenvironment of every process (attempt 0)\n";
  if (!envs.empty())
    for (const auto& [k, v] : envs[0])
      if (shared(k)) o += "  " + k + "=" + OneLine(k, v) + "\n";
  for (const ProcessPlan& w : plan.warmups) {
    o += "\nwarm-up " + w.name + " (" + (w.on_gpu() ? "GPU " + w.device : std::string("cpu")) +
         ", before " + w.role + "'s processes)\n     ";
    for (const auto& [k, v] : plan.ProcessEnv(w, 0))
      if (!shared(k) || *values[k].begin() != v) o += " " + k + "=" + Quoted(k, v);
    o += "\n";
  }
  bool any_gpu = false;
  for (const ProcessPlan& p : plan.processes) any_gpu |= p.on_gpu();
  if (any_gpu) {
    o += "\nGPUs";
    if (!plan.inherited_visible_devices.empty())
      o += " (devices index into the launcher's CUDA_VISIBLE_DEVICES=" + plan.inherited_visible_devices + ")";
    o += "\n";
    if (!plan.host_gpus.nvml) o += "  not checked: NVML: " + plan.host_gpus.why_not + "\n";
    for (const GpuInfo& g : plan.host_gpus.gpus)
      o += "  " + Pad(std::to_string(g.index), 4) + DescribeGpu(g) + "  " + g.uuid + "\n";
  }
  o += "\nprocesses (world size " + std::to_string(plan.world_size) +
       (plan.nnodes > 1 ? ", node " + std::to_string(plan.node_rank) + "'s " + std::to_string(plan.local_world_size)
                        : std::string()) +
       ")\n";
  for (size_t i = 0; i < plan.processes.size(); ++i) {
    const ProcessPlan& p = plan.processes[i];
    std::string gpu = "cpu";
    if (p.on_gpu()) {
      gpu = "GPU " + p.device;
      if (p.visible_device != p.device) gpu += " = " + p.visible_device + " of the launcher's CUDA_VISIBLE_DEVICES";
      gpu += " (cuda:0 inside)";
      if (const GpuInfo* g = plan.HostGpuOf(p)) gpu += ": " + DescribeGpu(*g);
    }
    o += "  " + Pad(p.name, 12) + "rank " + Pad(std::to_string(p.rank), 4) + gpu + "\n";
    std::string line;
    for (const auto& [k, v] : envs[i])
      if (!shared(k)) line += (line.empty() ? "" : " ") + k + "=" + Quoted(k, v);
    o += "      " + line + "\n";
  }
  return o;
}

}  // namespace

std::string PlanText(const Plan& plan) {
  const RunConfig& c = plan.config;
  std::string o = RunText(plan);
  if (c.model.present) o += ContractText(c.model);
  o += "\nroles  (start order: " + DescribeStartOrder(c.roles) + "; a stop runs it in reverse)\n";
  for (size_t i = 0; i < c.roles.size(); ++i) o += RoleText(plan, i);
  return o + EnvironmentAndProcessesText(plan);
}

}  // namespace dflash
