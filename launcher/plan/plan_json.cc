// `check --json`: the plan as data (docs/check-json.md), every value `check` shows and the files and hashes its text
// folds into one line.
#include "launcher/plan/plan_format.h"

#include <algorithm>

#include <nlohmann/json.hpp>

#include "common/redact.h"
#include "common/signal_names.h"
#include "contract/env_vars.h"
#include "launcher/config/role_order.h"

namespace dflash {
namespace {

/// A process's exec argv as check shows it: the launcher's own part (dflash-worker and its flags: --gate-key is
/// a key of the cache, no secret) as it is, the role's command after it through RedactArgv.
std::vector<std::string> ShownArgv(std::vector<std::string> argv, const std::vector<std::string>& command) {
  if (command.empty() || argv.size() < command.size() ||
      !std::equal(command.begin(), command.end(), argv.end() - static_cast<std::ptrdiff_t>(command.size()))) {
    for (std::string& a : argv) a = RedactSecretsInText(a);  // no flag rule: the launcher's flags are no secrets
    return argv;
  }
  std::vector<std::string> tail = RedactArgv(command);
  std::copy(tail.begin(), tail.end(), argv.end() - static_cast<std::ptrdiff_t>(command.size()));
  return argv;
}

using ojson = nlohmann::ordered_json;

ojson ProbeJson(bool on, const ProbeSpec& p) {
  if (!on) return ojson();
  return {{"kind", p.kind == ProbeKind::kTcp ? "tcp" : "http"}, {"host", p.host}, {"port", p.port},
          {"url", p.kind == ProbeKind::kHttp ? ojson(RedactSecretsInText(p.url)) : ojson()},
          {"status", p.kind == ProbeKind::kHttp ? ojson(p.statuses.text()) : ojson()},
          {"interval_ms", p.interval.count()}, {"probe_timeout_ms", p.timeout.count()}};
}

ojson KeyFilesJson(const std::vector<KeyFile>& files) {
  ojson a = ojson::array();
  for (const KeyFile& f : files)
    a.push_back({{"why", f.why}, {"path", f.path.empty() ? ojson() : ojson(f.path)},
                 {"sha256", f.sha256.empty() ? ojson() : ojson(f.sha256)}, {"note", f.note.empty() ? ojson() : ojson(f.note)}});
  return a;
}

/// The run: ids, dirs, master, nodes, signals, the store (null in static mode).
ojson RunJson(const Plan& plan) {
  const RunConfig& c = plan.config;
  ojson j;
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
  ojson stops = ojson::array();
  for (int s : c.run.stop_signals) stops.push_back(SignalName(s));
  j["run"]["stop_signals"] = stops;
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
  return j["run"];
}

/// The [model] shape contract, or null.
ojson ModelJson(const ModelSpec& m) {
  ojson j;
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
  return j["model"];
}

/// Role `i` as the plan has it.
ojson RoleJson(const Plan& plan, size_t i) {
  const RunConfig& c = plan.config;
  const RoleSpec& r = c.roles[i];
  std::string key;
  for (const ProcessPlan& p : plan.processes)
    if (p.role_index == i) key = p.gate_key;
  ojson codes = ojson::array();
  for (int e : r.restart.no_restart_exit_codes) codes.push_back(e);
  return ojson({
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
      {"command", r.command.empty() ? ojson() : ojson(RedactArgv(r.command))},
      {"builtin", r.builtin.empty() ? ojson() : ojson(r.builtin)},
      {"spool", r.ProducesFrames()                             ? ojson("produce")
                : (r.spool == "consume" || r.builtin == "drafter") ? ojson("consume")
                                                                   : ojson()},
      {"torch_version", plan.roles[i].torch_version.empty() ? ojson() : ojson(plan.roles[i].torch_version)},
      {"gpu_identity", plan.roles[i].gpu_identity.empty() ? ojson() : ojson(plan.roles[i].gpu_identity)},
      {"cpu_identity", plan.roles[i].cpu_identity.empty() ? ojson() : ojson(plan.roles[i].cpu_identity)},
      {"cache_key_tag", plan.roles[i].cache_key_tag.empty() ? ojson() : ojson(plan.roles[i].cache_key_tag)},
      {"gate", {{"enabled", r.gate.enabled}, {"key", key.empty() ? ojson() : ojson(key)},
                {"derived", r.gate.enabled && r.gate.key.empty()}, {"timeout_ms", r.gate.timeout.count()},
                {"mode", GateModeName(r.gate_mode())}, {"hold", GateHoldName(r.gate_hold())},
                {"idle_hint_ms", r.gate.idle_hint.count()},
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

/// NVML's view of this host, or null.
ojson GpusJson(const Plan& plan) {
  ojson j;
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
  return j["gpus"];
}

/// The warm-ups and this node's processes, each with its argv and environment.
void ProcessesJson(const Plan& plan, ojson* out) {
  ojson& j = *out;
  j["processes"] = ojson::array();
  j["warmups"] = ojson::array();
  for (const ProcessPlan& w : plan.warmups) {
    ojson env = ojson::object();
    for (const auto& [k, v] : plan.ProcessEnv(w, 0)) env[k] = ShownEnvValue(k, v);
    j["warmups"].push_back({{"name", w.name}, {"role", w.role},
                            {"device", w.on_gpu() ? "cuda:" + w.device : "cpu"},
                            {"command", RedactArgv(w.command)}, {"argv", ShownArgv(plan.ExecArgv(w), w.command)}, {"gate_key", w.gate_key}, {"env", env}});
  }
  for (const ProcessPlan& p : plan.processes) {
    ojson env = ojson::object();
    for (const auto& [k, v] : plan.ProcessEnv(p, 0)) env[k] = ShownEnvValue(k, v);
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
                              {"command", RedactArgv(p.command)},
                              {"argv", ShownArgv(plan.ExecArgv(p), p.command)},
                              {"gate_key", p.gate_key.empty() ? ojson() : ojson(p.gate_key)},
                              {"ready", ReadyModeName(plan.RoleOf(p).ready.mode)},
                              {"env", env}});
  }
}

}  // namespace

std::string PlanJson(const Plan& plan) {
  const RunConfig& c = plan.config;
  ojson j;
  j["format"] = "dflash-plan/1";
  j["config"] = c.path;
  j["run"] = RunJson(plan);
  j["model"] = ModelJson(c.model);
  j["start_order"] = DescribeStartOrder(c.roles);
  j["roles"] = ojson::array();
  for (size_t i = 0; i < c.roles.size(); ++i) j["roles"].push_back(RoleJson(plan, i));
  j["gpus"] = GpusJson(plan);
  j["world_size"] = plan.world_size;
  j["local_world_size"] = plan.local_world_size;
  ProcessesJson(plan, &j);
  return j.dump(2) + "\n";
}

}  // namespace dflash
