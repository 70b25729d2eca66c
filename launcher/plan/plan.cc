#include "launcher/plan/plan.h"

#include <sched.h>
#include <unistd.h>

#include <cctype>
#include <algorithm>
#include <map>
#include <set>

#include "common/duration.h"
#include "common/hash.h"
#include "worker/protocol.h"

namespace dflash {
namespace {

bool AffectsCompile(const std::string& name) {
  if (name == "TORCHINDUCTOR_CACHE_DIR" || name == "TRITON_CACHE_DIR") return false;  // where, not what
  // How many workers compile, not what they produce: the launcher gives the
  // leader and its followers different values (Plan::leader_compile_threads).
  if (name == "TORCHINDUCTOR_COMPILE_THREADS") return false;
  for (const char* prefix : {"TORCHINDUCTOR_", "TORCH_COMPILE_", "TORCHDYNAMO_", "TRITON_"})
    if (name.rfind(prefix, 0) == 0) return true;
  return false;
}

std::string ModelCanonical(const ModelSpec& m) {
  if (!m.present) return "none";
  std::vector<int64_t> taps(m.tapped_layers.begin(), m.tapped_layers.end());
  return "layers=" + std::to_string(m.target_layers) + ";hidden=" + std::to_string(m.hidden) + ";taps=" +
         JoinInts(taps) + ";draft_layers=" + std::to_string(m.draft_layers) + ";block=" +
         std::to_string(m.block_size) + ";seq=" + std::to_string(m.seq_len) + ";batch=" + std::to_string(m.batch) +
         ";dtype=" + m.dtype + ";heads=" + std::to_string(m.heads) + ";kv_heads=" + std::to_string(m.kv_heads) +
         ";vocab=" + std::to_string(m.vocab);
}

/// Plan::role_gpu_identity for one role: its GPUs' models as NVML names them (never their
/// indices: the same model anywhere shares kernels), then what its interpreter runs them with.
std::string GpuIdentityOf(const RoleSpec& role, const std::vector<std::string>& inherited, const GpuInventory& inv,
                          const std::string& runtime) {
  if (role.is_cpu()) return "cpu";
  std::set<std::string> models;
  for (size_t i = 0; i < role.devices.size(); ++i) {
    std::string v = role.DeviceName(i);
    if (role.devices[i] >= 0 && static_cast<size_t>(role.devices[i]) < inherited.size()) v = inherited[role.devices[i]];
    const GpuInfo* g = nullptr;
    for (const GpuInfo& h : inv.gpus)
      if (v == h.uuid || v == std::to_string(h.index)) g = &h;
    models.insert(g ? g->name + (g->capability.empty() ? "" : " sm " + g->capability) : "unknown GPU");
  }
  std::string s;
  for (const std::string& m : models) s += (s.empty() ? "" : " + ") + m;
  return s + "; " + (runtime.empty() ? "unknown" : runtime);
}

}  // namespace

std::string JoinInts(const std::vector<int64_t>& v, const char* sep) {
  std::string s;
  for (size_t i = 0; i < v.size(); ++i) s += (i ? sep : "") + std::to_string(v[i]);
  return s;
}

std::string DeriveGateKey(const RoleSpec& role, const ModelSpec& model, const std::string& torch_version,
                          const EnvList& launcher_env, const std::vector<KeyFile>& files,
                          const std::string& gpu_identity) {
  std::map<std::string, std::string> env;
  for (const auto& [k, v] : launcher_env)
    if (AffectsCompile(k)) env[k] = v;
  for (const auto& [k, v] : role.env)
    if (AffectsCompile(k)) env[k] = v;
  std::string text = "dflash-gate-key/1\nrole=" + role.name + "\ntorch=" + torch_version + "\nmodel=" +
                     ModelCanonical(model) + "\n";
  if (!role.builtin.empty()) text += "builtin=" + role.builtin + "\n";
  // Kernels tuned for one GPU model, CUDA and Triton are no promise for another (Inductor's
  // own keys see them too: a READY made elsewhere would promise a cache that misses).
  if (!gpu_identity.empty()) text += "gpu=" + gpu_identity + "\n";
  for (const std::string& a : role.command) text += "arg=" + a + "\n";
  for (const auto& [k, v] : env) text += "env=" + k + "=" + v + "\n";
  for (const KeyFile& f : files)
    text += "file=" + f.why + ":" + f.path + ":" + (f.sha256.empty() ? "missing" : f.sha256) + "\n";
  return role.name + "-" + Sha256Hex(text).substr(0, 16);
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

int DerivedMasterPort(const std::string& run_id, size_t roles) {
  constexpr int kLow = 20000, kHigh = 32767;  // [kLow, kHigh): below ip_local_port_range's default 32768
  int span = kHigh - kLow - static_cast<int>(roles);
  unsigned long long h = std::stoull(Sha256Hex("dflash-master-port/1\n" + run_id).substr(0, 12), nullptr, 16);
  return kLow + static_cast<int>(h % static_cast<unsigned long long>(span > 1 ? span : 1));
}

std::vector<std::string> SplitVisibleDevices(const std::string& value) {
  std::vector<std::string> out;
  size_t i = 0;
  while (i <= value.size()) {
    size_t j = value.find(',', i);
    if (j == std::string::npos) j = value.size();
    std::string e = value.substr(i, j - i);
    while (!e.empty() && e.front() == ' ') e.erase(e.begin());
    while (!e.empty() && e.back() == ' ') e.pop_back();
    out.push_back(e);
    i = j + 1;
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

const GpuInfo* Plan::HostGpuOf(const ProcessPlan& p) const {
  const std::string& v = p.visible_device;
  for (const GpuInfo& g : host_gpus.gpus)
    if (v == g.uuid || v == std::to_string(g.index)) return &g;
  return nullptr;
}

int PrivateStorePort(int master_port, size_t roles) { return master_port + 1 + 2 * static_cast<int>(roles); }

std::string Plan::StoreUrlText() const {
  if (!store_private()) return store;
  std::string host = master_addr.find(':') != std::string::npos ? "[" + master_addr + "]" : master_addr;
  return "redis://" + host + ":" + (store_port ? std::to_string(store_port) : std::string("<auto>"));
}

Plan BuildPlan(const RunConfig& config, const PlanOptions& options) {
  Plan plan;
  plan.config = config;
  plan.run_id = options.run_id;
  plan.nnodes = options.nnodes;
  plan.node_rank = options.node_rank;
  // Nodes of one run may share a filesystem: each writes its own node_<r>/.
  std::string node_dir = options.nnodes > 1 ? "/node_" + std::to_string(options.node_rank) : "";
  plan.run_dir = config.run.log_dir + "/" + options.run_id + node_dir;
  plan.bin_dir = options.bin_dir;
  plan.master_addr = options.master_addr.empty() ? config.run.master_addr : options.master_addr;
  plan.master_port = options.master_port >= 0 ? options.master_port : config.run.master_port;
  if (plan.master_port == 0 && options.nnodes > 1 && options.run_id != "<run_id>")
    plan.master_port = DerivedMasterPort(options.run_id, config.roles.size());
  for (size_t ri = 0; ri < config.roles.size(); ++ri)
    plan.role_master_ports.push_back(plan.master_port ? plan.master_port + 1 + static_cast<int>(ri) : 0);
  plan.store = options.store.empty() ? config.run.store : options.store;
  // A private store of several nodes sits after the role and warm-up ports: every node knows it.
  if (plan.store_private() && options.nnodes > 1 && plan.master_port)
    plan.store_port = PrivateStorePort(plan.master_port, config.roles.size());

  for (const auto& [k, v] : options.launcher_env)
    if (k == "CUDA_VISIBLE_DEVICES") plan.inherited_visible_devices = v;
  std::vector<std::string> inherited = plan.inherited_visible_devices.empty()
                                           ? std::vector<std::string>{}
                                           : SplitVisibleDevices(plan.inherited_visible_devices);
  plan.host_gpus = options.host_gpus;
  std::vector<std::string> keys;
  for (size_t ri = 0; ri < config.roles.size(); ++ri) {
    const RoleSpec& role = config.roles[ri];
    // Only gated roles need torch's version (their key, their READY record);
    // asking a Python costs ~50 ms, which a plain start should not pay.
    std::string torch = role.gate.enabled && options.torch_version && role.RunsOnNode(options.node_rank)
                            ? options.torch_version(role)
                            : "";
    plan.role_torch_version.push_back(torch);
    std::string gpu;
    if (role.gate.enabled && role.RunsOnNode(options.node_rank))
      gpu = GpuIdentityOf(role, inherited, options.host_gpus,
                          role.is_cpu() || !options.cuda_runtime ? "" : options.cuda_runtime(role));
    plan.role_gpu_identity.push_back(gpu);
    std::string key;
    std::vector<KeyFile> files;
    if (role.gate.enabled && role.gate.key.empty()) {
      files = CollectKeyFiles(role, options.launcher_env);
      key = DeriveGateKey(role, config.model, torch, options.launcher_env, files, gpu);
    } else if (role.gate.enabled) {
      key = role.gate.key;
    }
    plan.role_key_files.push_back(files);
    keys.push_back(key);
  }
  // Global ranks: node by node (torchrun's order), then role by role, then device by device.
  plan.role_world_size.assign(config.roles.size(), 0);
  plan.role_first_node.assign(config.roles.size(), -1);
  int rank = 0;
  for (int node = 0; node < options.nnodes; ++node) {
    for (size_t ri = 0; ri < config.roles.size(); ++ri) {
      const RoleSpec& role = config.roles[ri];
      if (!role.RunsOnNode(node)) continue;
      if (plan.role_first_node[ri] < 0) plan.role_first_node[ri] = node;
      for (int i = 0; i < role.process_count(); ++i) {
        int role_rank = plan.role_world_size[ri]++;
        int r = rank++;
        if (node != options.node_rank) continue;
        ProcessPlan p;
        p.name = role.name + ":" + std::to_string(role_rank);
        p.role = role.name;
        p.role_index = ri;
        p.role_rank = role_rank;
        p.rank = r;
        if (!role.is_cpu()) {
          size_t d = static_cast<size_t>(i);
          p.gpu = role.devices[d];
          p.device = role.DeviceName(d);
          p.visible_device = p.device;
          // `devices` index into the GPUs the launcher was given (CheckDevices refuses one past them).
          if (p.gpu >= 0 && static_cast<size_t>(p.gpu) < inherited.size()) p.visible_device = inherited[p.gpu];
        }
        p.command = role.builtin.empty()
                        ? role.command
                        : std::vector<std::string>{options.bin_dir + "/dflash-builtin", role.builtin};
        p.gate_key = keys[ri];
        plan.processes.push_back(std::move(p));
      }
    }
  }
  plan.world_size = rank;
  plan.local_world_size = static_cast<int>(plan.processes.size());
  for (ProcessPlan& p : plan.processes) p.role_world_size = plan.role_world_size[p.role_index];
  // Each node warms up the gated roles it runs, as their first process here would run.
  plan.warmup_master_ports.assign(config.roles.size(), 0);
  for (size_t ri = 0; ri < config.roles.size(); ++ri) {
    const RoleSpec& role = config.roles[ri];
    auto first = std::find_if(plan.processes.begin(), plan.processes.end(),
                              [&](const ProcessPlan& p) { return p.role_index == ri; });
    if (!role.warmup_gated() || first == plan.processes.end()) continue;
    ProcessPlan w = *first;
    w.name = role.name + ":warmup";
    w.role_rank = 0;
    w.role_world_size = 1;
    w.rank = 0;
    if (!role.warmup.empty()) w.command = role.warmup;
    w.warmup = true;
    plan.warmups.push_back(std::move(w));
    // An explicit port: the warm-ups' follow the roles'; "auto": reserved at run time.
    if (plan.master_port)
      plan.warmup_master_ports[ri] = plan.master_port + 1 + static_cast<int>(config.roles.size() + ri);
  }
  bool launcher_sets_omp = false;
  for (const auto& [k, v] : options.launcher_env) launcher_sets_omp |= k == "OMP_NUM_THREADS";
  plan.default_omp_threads = plan.local_world_size > 1 && !launcher_sets_omp;
  bool launcher_sets_order = false, launcher_sets_threads = false;
  for (const auto& [k, v] : options.launcher_env) {
    launcher_sets_order |= k == "CUDA_DEVICE_ORDER";
    launcher_sets_threads |= k == "TORCHINDUCTOR_COMPILE_THREADS";
  }
  plan.default_device_order = !launcher_sets_order;
  if (!launcher_sets_threads) {
    // One compile pool's worth of workers per host (pytorch#190941): the gates that may
    // compile at once here (one leader per key) share the CPUs this launcher may use.
    std::set<std::string> keys_here;
    for (const ProcessPlan& p : plan.processes)
      if (!p.gate_key.empty()) keys_here.insert(p.gate_key);
    int cpus = 0;
    cpu_set_t set;
    if (::sched_getaffinity(0, sizeof set, &set) == 0) cpus = CPU_COUNT(&set);
    if (cpus <= 0) cpus = static_cast<int>(::sysconf(_SC_NPROCESSORS_ONLN));
    int share = keys_here.empty() ? 1 : std::max(1, cpus / static_cast<int>(keys_here.size()));
    plan.leader_compile_threads = std::min(32, share);  // Inductor's own cap (decide_compile_threads)
  }
  return plan;
}

int Plan::FirstNode() const {
  int first = -1;
  for (int n : role_first_node)
    if (n >= 0 && (first < 0 || n < first)) first = n;
  return first;
}

std::string Plan::AttemptPath(const ProcessPlan& p, int attempt, const std::string& suffix) const {
  return run_dir + "/attempt_" + std::to_string(attempt_base + attempt) + "/" + p.role + "-" +
         (p.warmup ? std::string("warmup") : std::to_string(p.role_rank)) + "." + suffix;
}

EnvList Plan::ProcessEnv(const ProcessPlan& p, int attempt) const {
  const RunSpec& run = config.run;
  const ModelSpec& m = config.model;
  auto port = [](int port) { return port > 0 ? std::to_string(port) : std::string("<auto>"); };
  // Its role world's store runs beside the role's rank 0: on node 0 that is
  // MASTER_ADDR; elsewhere the static mode does not know the address (docs/multinode.md).
  int role_node = role_first_node[p.role_index];
  // A warm-up is a world of one on this host, with a port of its own: it
  // needs no peer, and no peer of the run can meet it by accident.
  const bool w = p.warmup;
  EnvList env = {
      {"CUDA_VISIBLE_DEVICES", p.visible_device},
      // One GPU per process, seen as cuda:0: LOCAL_RANK is the device index inside the process.
      {"LOCAL_RANK", "0"},
      {"RANK", std::to_string(p.rank)},
      {"WORLD_SIZE", w ? "1" : std::to_string(world_size)},
      {"LOCAL_WORLD_SIZE", w ? "1" : std::to_string(local_world_size)},
      {"GROUP_RANK", w ? "0" : std::to_string(node_rank)},
      {"GROUP_WORLD_SIZE", w ? "1" : std::to_string(nnodes)},
      {"MASTER_ADDR", w ? "127.0.0.1" : master_addr},
      {"MASTER_PORT", port(w ? warmup_master_ports[p.role_index] : master_port)},
      {"ROLE_NAME", p.role},
      {"ROLE_RANK", std::to_string(p.role_rank)},
      {"ROLE_WORLD_SIZE", std::to_string(p.role_world_size)},
      {"ROLE_MASTER_ADDR", w ? "127.0.0.1" : role_node == 0 || nnodes == 1 ? master_addr : std::string()},
      {"ROLE_MASTER_PORT", port(w ? warmup_master_ports[p.role_index] : role_master_ports[p.role_index])},
      {"TORCHINDUCTOR_CACHE_DIR", run.cache_dir},
      {"TRITON_CACHE_DIR", run.cache_dir + "/triton"},
      {"TORCHELASTIC_ERROR_FILE", AttemptPath(p, attempt, "error.json")},
      {"TORCHELASTIC_RESTART_COUNT", std::to_string(attempt)},
      {"DFLASH_RUN_ID", run_id},
      {"DFLASH_RUN_DIR", run_dir},
      {"DFLASH_PROCESS", p.name},
      {"DFLASH_ATTEMPT", std::to_string(attempt)},
      {"DFLASH_METRICS_FILE", AttemptPath(p, attempt, "metrics.json")},
      {"DFLASH_SPOOL_DIR", SpoolDir()},
      {"DFLASH_SPOOL_PRODUCERS", std::to_string(SpoolProducers())},
      {"DFLASH_NODE_RANK", std::to_string(node_rank)},
      {"DFLASH_NNODES", std::to_string(nnodes)},
  };
  // The cluster-wide compile gate (worker) and payloads find the run's store here.
  if (!store.empty()) env.emplace_back("DFLASH_STORE", StoreUrlText());
  // Its password, in a 0600 file the launcher writes (launcher/cluster/store_session.h): a path here,
  // never the secret, so neither `check` nor /proc/<pid>/environ shows it.
  if (!store.empty() && (store_private() || !run.store_password_file.empty() || !run.store_password_env.empty()))
    env.emplace_back("DFLASH_STORE_SECRET_FILE", run_dir + "/store.secret");
  if (!store.empty() && !run.store_user.empty()) env.emplace_back("DFLASH_STORE_USER", run.store_user);
  if (p.warmup) {
    env.emplace_back("DFLASH_WARMUP", "1");
    // The worlds it stands in for: a graph with collectives inside it needs
    // their real sizes (dflash_launch.init_process_group(fake_world_in_warmup=True)).
    env.emplace_back("DFLASH_RUN_WORLD_SIZE", std::to_string(world_size));
    env.emplace_back("DFLASH_RUN_ROLE_WORLD_SIZE", std::to_string(role_world_size[p.role_index]));
  }
  if (!p.gate_key.empty()) env.emplace_back("DFLASH_GATE_KEY", p.gate_key);
  // Gated and log-watched processes are judged by what they say when they say
  // it: Python's block-buffered stdout on a pipe would hold a READY line back.
  if (!p.gate_key.empty() || RoleOf(p).ready.mode == ReadyMode::kLog) env.emplace_back("PYTHONUNBUFFERED", "1");
  if (!p.gate_key.empty()) env.emplace_back("DFLASH_TORCH_VERSION", role_torch_version[p.role_index]);  // in READY
  // The derived key's files, into READY: a later leader names the one whose edit changed the key.
  if (!p.gate_key.empty() && p.role_index < role_key_files.size()) {
    std::string sources;
    for (const KeyFile& f : role_key_files[p.role_index])
      if (!f.path.empty() && f.path.find('\n') == std::string::npos)
        sources += (f.sha256.empty() ? "-" : f.sha256) + " " + f.path + "\n";
    if (!sources.empty()) env.emplace_back("DFLASH_GATE_SOURCES", sources);
  }
  // In READY and in the archives it exports; an import or fetch for another GPU identity is refused.
  if (!p.gate_key.empty()) env.emplace_back("DFLASH_GPU_IDENTITY", role_gpu_identity[p.role_index]);
  if (m.present) {
    std::vector<int64_t> taps(m.tapped_layers.begin(), m.tapped_layers.end());
    env.insert(env.end(), {
                              {"DFLASH_HIDDEN_SHAPE", JoinInts(m.HiddenShape())},
                              {"DFLASH_TAPPED_LAYERS", JoinInts(taps)},
                              {"DFLASH_TARGET_LAYERS", std::to_string(m.target_layers)},
                              {"DFLASH_HIDDEN", std::to_string(m.hidden)},
                              {"DFLASH_DRAFT_LAYERS", std::to_string(m.draft_layers)},
                              {"DFLASH_BLOCK_SIZE", std::to_string(m.block_size)},
                              {"DFLASH_SEQ_LEN", std::to_string(m.seq_len)},
                              {"DFLASH_BATCH", std::to_string(m.batch)},
                              {"DFLASH_DTYPE", m.dtype},
                              {"DFLASH_VOCAB", std::to_string(m.vocab)},
                              {"DFLASH_SEED", std::to_string(m.seed)},
                          });
    if (m.heads > 0) env.emplace_back("DFLASH_HEADS", std::to_string(m.heads));
    if (m.kv_heads > 0) env.emplace_back("DFLASH_KV_HEADS", std::to_string(m.kv_heads));
  }
  const RoleSpec& role = RoleOf(p);
  bool role_sets_omp = false;
  for (const auto& [k, v] : role.env) role_sets_omp |= k == "OMP_NUM_THREADS";
  // torchrun's default: processes sharing a host would each start one OpenMP thread per core.
  if (default_omp_threads && !role_sets_omp) env.emplace_back("OMP_NUM_THREADS", "1");
  // GPU numbering and compile workers (issue #25); kept together so the
  // process-environment contract can take them over as one block.
  bool role_sets_order = false, role_sets_threads = false;
  for (const auto& [k, v] : role.env) {
    role_sets_order |= k == "CUDA_DEVICE_ORDER";
    role_sets_threads |= k == "TORCHINDUCTOR_COMPILE_THREADS";
  }
  // devices = [3] means what nvidia-smi and NVML call GPU 3 (CUDA's default order is fastest first).
  if (p.on_gpu() && default_device_order && !role_sets_order) env.emplace_back("CUDA_DEVICE_ORDER", "PCI_BUS_ID");
  if (!p.gate_key.empty() && leader_compile_threads > 0 && !role_sets_threads) {
    // A follower reuses the leader's kernels: one worker. dflash-worker gives its
    // payload the leader's share once the gate makes it the leader.
    env.emplace_back("TORCHINDUCTOR_COMPILE_THREADS", "1");
    env.emplace_back("DFLASH_LEADER_COMPILE_THREADS", std::to_string(leader_compile_threads));
  }
  env.insert(env.end(), role.env.begin(), role.env.end());
  return env;
}

std::string Plan::SpoolDir() const {
  // /dev/shm is per host, and two node launchers may share one (tests, a fat node).
  return config.run.spool_dir + "/" + run_id + (nnodes > 1 ? "/node_" + std::to_string(node_rank) : "");
}

int Plan::SpoolProducers() const {
  int n = 0;  // the spool is node-local: only this node's targets feed it
  for (const ProcessPlan& p : processes)
    if (RoleOf(p).ProducesFrames()) ++n;
  return n;
}

bool Plan::NeedsWorker(const ProcessPlan& p) const {
  ReadyMode m = RoleOf(p).ready.mode;
  // In warmup mode the warm-up holds the gate; the role's processes start on
  // a warm cache and take no gate themselves.
  bool gated_here = !p.gate_key.empty() && (p.warmup || !RoleOf(p).warmup_gated());
  return gated_here || m == ReadyMode::kLog || m == ReadyMode::kFile;
}

std::vector<std::string> Plan::ExecArgv(const ProcessPlan& p) const {
  if (!NeedsWorker(p)) return p.command;
  const RoleSpec& role = RoleOf(p);
  WorkerArgs w;
  w.name = p.name;
  if (!p.gate_key.empty() && (p.warmup || !role.warmup_gated())) {
    w.gate_dir = config.run.cache_dir;
    w.gate_key = p.gate_key;
    w.gate_timeout = role.gate.timeout;
    w.gate_idle_hint = role.gate.idle_hint;
    w.warmup = p.warmup;
  }
  w.ready = role.ready;
  w.command = p.command;
  return EncodeWorkerArgv(bin_dir + "/dflash-worker", w);
}

}  // namespace dflash
