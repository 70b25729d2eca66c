#include "launcher/plan/plan_format.h"

#include "launcher/config/role_order.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <map>
#include <set>

#include "common/duration.h"
#include "common/redact.h"
#include "common/signal_names.h"
#include "contract/process_env.h"
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

/// The text plan shows a value on one line: a list of lines (DFLASH_GATE_SOURCES: the gate key's files, one
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

/// A tcp/http probe for the check JSON (null when there is none).
static ojson ProbeJson(bool on, const ProbeSpec& p) {
  if (!on) return ojson();
  return {{"kind", p.kind == ProbeKind::kTcp ? "tcp" : "http"}, {"host", p.host}, {"port", p.port},
          {"url", p.kind == ProbeKind::kHttp ? ojson(RedactSecretsInText(p.url)) : ojson()},
          {"status", p.kind == ProbeKind::kHttp ? ojson(p.statuses.text()) : ojson()},
          {"interval_ms", p.interval.count()}, {"probe_timeout_ms", p.timeout.count()}};
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

std::string PlanText(const Plan& plan) {
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
  const ModelSpec& m = c.model;
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
  o += "\nroles  (start order: " + DescribeStartOrder(c.roles) + "; a stop runs it in reverse)\n";
  for (size_t i = 0; i < c.roles.size(); ++i) {
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
         (r.builtin.empty() ? "command: " + Join(r.command) : "builtin " + r.builtin) + "\n";
    std::string key;
    for (const ProcessPlan& p : plan.processes)
      if (p.role_index == i) key = p.gate_key;
    o += "  " + Pad("", 10) + "gate     " +
         (r.gate.enabled ? key + (r.gate.key.empty() ? " (derived)" : "") + ", mode " + GateModeName(r.gate_mode()) +
                               (r.gate.mode == GateMode::kAuto ? " (auto)" : "") + ", wait up to " +
                               FormatDuration(r.gate.timeout)
                         : std::string("off")) +
         "\n";
    if (!plan.roles[i].precompile_why.empty())
      o += "  " + Pad("", 10) + "  precompile " + plan.roles[i].precompile_why + "\n";
    o += KeyFilesText(plan.roles[i].key_files, "  " + Pad("", 10) + "  ");
    if (r.warmup_gated())
      o += "  " + Pad("", 10) + "warm-up  " + r.name + ":warmup compiles first, in a world of one (RANK=0 WORLD_SIZE=1 "
           "ROLE_WORLD_SIZE=1 DFLASH_WARMUP=1, its own MASTER_PORT): " +
           Join(r.warmup.empty() ? (r.builtin.empty() ? r.command : std::vector<std::string>{"dflash-builtin", r.builtin})
                                 : r.warmup) +
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
  }
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

namespace {
ojson KeyFilesJson(const std::vector<KeyFile>& files) {
  ojson a = ojson::array();
  for (const KeyFile& f : files)
    a.push_back({{"why", f.why}, {"path", f.path.empty() ? ojson() : ojson(f.path)},
                 {"sha256", f.sha256.empty() ? ojson() : ojson(f.sha256)}, {"note", f.note.empty() ? ojson() : ojson(f.note)}});
  return a;
}
}  // namespace

std::string PlanJson(const Plan& plan) {
  const RunConfig& c = plan.config;
  ojson j;
  j["format"] = "dflash-plan/1";
  j["config"] = c.path;
  j["run"] = {{"name", c.run.name},           {"run_id", plan.run_id},
              {"cache_dir", c.run.cache_dir}, {"log_dir", c.run.log_dir},
              {"run_dir", plan.run_dir},      {"spool_dir", c.run.spool_dir},
              {"master_addr", plan.master_addr},
              {"master_port", plan.master_port ? ojson(plan.master_port) : ojson()},
              {"master_port_auto", c.run.master_port == 0},
              {"nnodes", plan.nnodes}, {"node_rank", plan.node_rank}};
  ojson fwd = ojson::array();
  for (int s : c.run.forward_signals) fwd.push_back(SignalName(s));
  j["run"]["forward_signals"] = fwd;
  j["run"]["share_gpus"] = c.run.share_gpus;
  // The coordination store (docs/multinode.md): null in static mode.
  if (plan.store.empty()) {
    j["run"]["store"] = nullptr;
  } else {
    j["run"]["store"] = {{"url", plan.store_private() && !plan.store_port ? ojson() : ojson(plan.StoreUrlText())},
                         {"private", plan.store_private()},
                         {"ttl_ms", c.run.store_ttl.count()},
                         {"barrier_timeout_ms", c.run.store_barrier_timeout.count()},
                         {"outage_ms", c.run.store_outage.count()}};
  }
  const ModelSpec& m = c.model;
  if (m.present) {
    j["model"] = {{"target_layers", m.target_layers}, {"hidden", m.hidden}, {"tapped_layers", m.tapped_layers},
                  {"tapped_layers_derived", m.tapped_layers_derived}, {"draft_layers", m.draft_layers},
                  {"block_size", m.block_size}, {"seq_len", m.seq_len}, {"batch", m.batch}, {"dtype", m.dtype},
                  {"heads", m.heads ? ojson(m.heads) : ojson()}, {"kv_heads", m.kv_heads ? ojson(m.kv_heads) : ojson()},
                  {"vocab", m.vocab}, {"seed", m.seed}, {"hidden_shape", m.HiddenShape()},
                  {"fc", {m.NumTaps() * static_cast<int64_t>(m.hidden), m.hidden}}};
  } else {
    j["model"] = nullptr;
  }
  j["start_order"] = DescribeStartOrder(c.roles);
  j["roles"] = ojson::array();
  for (size_t i = 0; i < c.roles.size(); ++i) {
    const RoleSpec& r = c.roles[i];
    std::string key;
    for (const ProcessPlan& p : plan.processes)
      if (p.role_index == i) key = p.gate_key;
    ojson codes = ojson::array();
    for (int e : r.restart.no_restart_exit_codes) codes.push_back(e);
    j["roles"].push_back({
        {"name", r.name},
        {"processes", r.process_count()},
        {"nodes", r.nodes.empty() ? ojson() : ojson(r.nodes)},
        {"world_size", plan.roles[i].world_size},
        {"master_port", plan.roles[i].master_port ? ojson(plan.roles[i].master_port) : ojson()},
        {"devices", [&] {
           ojson d = ojson::array();
           for (size_t k = 0; k < r.devices.size(); ++k)
             d.push_back(r.devices[k] >= 0 ? ojson(r.devices[k]) : ojson(r.device_uuids[k]));
           return d;
         }()},
        {"cpu", r.is_cpu()},
        {"command", r.command.empty() ? ojson() : ojson(r.command)},
        {"builtin", r.builtin.empty() ? ojson() : ojson(r.builtin)},
        {"spool", r.ProducesFrames()                             ? ojson("produce")
                  : (r.spool == "consume" || r.builtin == "drafter") ? ojson("consume")
                                                                     : ojson()},
        {"torch_version", plan.roles[i].torch_version.empty() ? ojson() : ojson(plan.roles[i].torch_version)},
        {"gpu_identity", plan.roles[i].gpu_identity.empty() ? ojson() : ojson(plan.roles[i].gpu_identity)},
        {"gate", {{"enabled", r.gate.enabled}, {"key", key.empty() ? ojson() : ojson(key)},
                  {"derived", r.gate.enabled && r.gate.key.empty()}, {"timeout_ms", r.gate.timeout.count()},
                  {"mode", GateModeName(r.gate_mode())}, {"hold", GateHoldName(r.gate_hold())},
                  {"idle_hint_ms", r.gate.idle_hint.count()}, {"precompile", plan.roles[i].precompile},
                  {"precompile_why", plan.roles[i].precompile_why.empty() ? ojson() : ojson(plan.roles[i].precompile_why)},
                  {"key_files", KeyFilesJson(plan.roles[i].key_files)}}},
        {"ports", [&] {
           ojson ports = ojson::array();
           for (size_t k = 0; k < r.ports.size(); ++k) {
             ojson given = ojson::array();  // this node's processes, in role-rank order; null: not reserved yet
             for (const ProcessPlan& p : plan.processes)
               if (p.role_index == i && k < p.ports.size()) given.push_back(p.ports[k] ? ojson(p.ports[k]) : ojson());
             ports.push_back({{"name", r.ports[k]}, {"env", env::PortVar(r.ports[k])},
                              {"list_env", env::RolePortsVar(r.name, r.ports[k])}, {"ports", given}});
           }
           return ports;
         }()},
        {"ready", {{"mode", ReadyModeName(r.ready.mode)},
                   {"pattern", r.ready.mode == ReadyMode::kLog ? ojson(r.ready.arg) : ojson()},
                   {"path", r.ready.mode == ReadyMode::kFile ? ojson(r.ready.arg) : ojson()},
                   {"probe", ProbeJson(r.ready.probes(), r.ready.probe)},
                   {"timeout_ms", r.ready.timeout.count()}}},
        {"liveness", r.liveness.enabled ? ojson({{"probe", ProbeJson(true, r.liveness.probe)},
                                                 {"failures", r.liveness.failures}})
                                        : ojson()},
        {"restart", {{"policy", RestartPolicyName(r.restart.policy)}, {"scope", RestartScopeName(r.restart.scope)},
                     {"max", r.restart.max}, {"window_ms", r.restart.window.count()},
                     {"backoff_min_ms", r.restart.backoff_min.count()}, {"backoff_max_ms", r.restart.backoff_max.count()},
                     {"reset_after_ms", r.restart.reset_after.count()}, {"no_restart_exit_codes", codes}}},
        {"stop", {{"signal", SignalName(r.stop.signal)}, {"grace_ms", r.stop.grace.count()}}},
        {"world", TorchWorldName(r.world)},
        {"service", r.service},
        {"after", [&] {
           ojson d = ojson::array();
           for (size_t k : r.starts_after) d.push_back(c.roles[k].name);
           return d;
         }()},
        {"phase", r.phase},
        {"watchdog", {{"ms", r.watchdog.count()}, {"signal", SignalName(r.watchdog_signal)}}},
    });
  }
  // NVML's view of this host (null: not asked, no GPU process here; nvml false: not available).
  bool any_gpu = false;
  for (const ProcessPlan& p : plan.processes) any_gpu |= p.on_gpu();
  if (any_gpu) {
    ojson gpus = ojson::array();
    for (const GpuInfo& g : plan.host_gpus.gpus)
      gpus.push_back({{"index", g.index}, {"name", g.name}, {"uuid", g.uuid}, {"memory_bytes", g.memory_bytes},
                      {"compute_mode", g.compute_mode}});
    j["gpus"] = {{"nvml", plan.host_gpus.nvml},
                 {"why_not", plan.host_gpus.nvml ? ojson() : ojson(plan.host_gpus.why_not)},
                 {"inherited_visible_devices",
                  plan.inherited_visible_devices.empty() ? ojson() : ojson(plan.inherited_visible_devices)},
                 {"devices", gpus}};
  } else {
    j["gpus"] = nullptr;
  }
  j["world_size"] = plan.world_size;
  j["local_world_size"] = plan.local_world_size;
  j["processes"] = ojson::array();
  j["warmups"] = ojson::array();
  for (const ProcessPlan& w : plan.warmups) {
    ojson env = ojson::object();
    for (const auto& [k, v] : plan.ProcessEnv(w, 0)) env[k] = Shown(k, v);
    j["warmups"].push_back({{"name", w.name}, {"role", w.role},
                            {"device", w.on_gpu() ? "cuda:" + w.device : "cpu"},
                            {"command", w.command}, {"argv", plan.ExecArgv(w)}, {"gate_key", w.gate_key}, {"env", env}});
  }
  for (const ProcessPlan& p : plan.processes) {
    ojson env = ojson::object();
    for (const auto& [k, v] : plan.ProcessEnv(p, 0)) env[k] = Shown(k, v);
    j["processes"].push_back({{"name", p.name},
                              {"role", p.role},
                              {"role_rank", p.role_rank},
                              {"role_world_size", p.role_world_size},
                              {"rank", p.rank},
                              {"device", p.on_gpu() ? "cuda:" + p.device : "cpu"},
                              {"gpu", p.gpu >= 0 ? ojson(p.gpu) : p.on_gpu() ? ojson(p.device) : ojson()},
                              {"visible_device", p.on_gpu() ? ojson(p.visible_device) : ojson()},
                              {"gpu_model", [&] {
                                 const GpuInfo* g = plan.HostGpuOf(p);
                                 return g ? ojson({{"name", g->name}, {"memory_bytes", g->memory_bytes},
                                                   {"compute_mode", g->compute_mode}, {"uuid", g->uuid}})
                                          : ojson();
                               }()},
                              {"command", p.command},
                              {"argv", plan.ExecArgv(p)},
                              {"gate_key", p.gate_key.empty() ? ojson() : ojson(p.gate_key)},
                              {"ready", ReadyModeName(plan.RoleOf(p).ready.mode)},
                              {"env", env}});
  }
  return j.dump(2) + "\n";
}

}  // namespace dflash
