#include "launcher/plan/plan.h"

#include <sched.h>
#include <unistd.h>

#include <cctype>
#include <algorithm>
#include <map>
#include <optional>
#include <set>

#include "common/duration.h"
#include "common/cpu_identity.h"
#include "common/hash.h"
#include "contract/env_vars.h"
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

/// RolePlan::gpu_identity: its GPUs' models as NVML names them (never their
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
                          const std::string& gpu_identity, const std::string& cpu_identity) {
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
  // Inductor's CPU keys do not see the vector ISA (common/cpu_identity.h): a READY made on another CPU,
  // or with another ATEN_CPU_CAPABILITY, promises nothing here.
  if (!cpu_identity.empty()) text += "cpu=" + cpu_identity + "\n";
  for (const std::string& a : role.command) text += "arg=" + a + "\n";
  for (const auto& [k, v] : env) text += "env=" + k + "=" + v + "\n";
  for (const KeyFile& f : files)
    text += "file=" + f.why + ":" + f.path + ":" + (f.sha256.empty() ? "missing" : f.sha256) + "\n";
  return role.name + "-" + Sha256Hex(text).substr(0, 16);
}

int DerivedMasterPort(const std::string& run_id, size_t roles) {
  constexpr int kLow = 20000, kHigh = 32767;  // [kLow, kHigh): below ip_local_port_range's default 32768
  int span = kHigh - kLow - static_cast<int>(roles);
  unsigned long long h = std::stoull(Sha256Hex("dflash-master-port/1\n" + run_id).substr(0, 12), nullptr, 16);
  return kLow + static_cast<int>(h % static_cast<unsigned long long>(span > 1 ? span : 1));
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

namespace {

/// The run's ids, dirs, master ports and store: where this node stands.
void PlaceRun(const RunConfig& config, const PlanOptions& options, Plan* out) {
  Plan& plan = *out;
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
  plan.roles.resize(config.roles.size());
  for (size_t ri = 0; ri < config.roles.size(); ++ri)
    plan.roles[ri].master_port = plan.master_port ? plan.master_port + 1 + static_cast<int>(ri) : 0;
  plan.store = options.store.empty() ? config.run.store : options.store;
  if (plan.store.empty())
    for (const auto& [k, v] : options.launcher_env) {
      if (k == env::kStore) plan.gate_store = v;
      if (k == env::kStoreSecretFile) plan.gate_store_secret_file = v;
      if (k == env::kStoreUser) plan.gate_store_user = v;
    }
  // A private store of several nodes sits after the role and warm-up ports: every node knows it.
  if (plan.store_private() && options.nnodes > 1 && plan.master_port)
    plan.store_port = PrivateStorePort(plan.master_port, config.roles.size());

}

/// Each role's facts (RolePlan) and its gate key; returns the keys, one per role ("" for an ungated role).
std::vector<std::string> PlanRoles(const RunConfig& config, const PlanOptions& options,
                                   const std::vector<std::string>& inherited, Plan* out) {
  Plan& plan = *out;
  std::vector<std::string> keys;
  for (size_t ri = 0; ri < config.roles.size(); ++ri) {
    const RoleSpec& role = config.roles[ri];
    // Only gated roles need torch's version (their key, their READY record);
    // asking a Python costs ~50 ms, which a plain start should not pay.
    std::string torch = role.gate.enabled && options.torch_version && role.RunsOnNode(options.node_rank)
                            ? options.torch_version(role)
                            : "";
    RolePlan& rp = plan.roles[ri];
    rp.torch_version = torch;
    std::string gpu;
    if (role.gate.enabled && role.RunsOnNode(options.node_rank))
      gpu = GpuIdentityOf(role, inherited, options.host_gpus,
                          role.is_cpu() || !options.cuda_runtime ? "" : options.cuda_runtime(role));
    rp.gpu_identity = gpu;
    std::optional<std::string> cap, user_tag;
    for (const EnvList* env : {&options.launcher_env, &role.env})
      for (const auto& [k, v] : *env) {
        if (k == env::kAtenCpuCapability) cap = v;
        if (k == env::kTorchCompileCacheKeyTag) user_tag = v;
      }
    rp.cpu_identity = CpuIdentity(options.host_cpu, cap);
    rp.cache_key_tag = WithCpuTag(user_tag.value_or(""), CpuCacheTag(rp.cpu_identity));
    std::string key;
    std::vector<KeyFile> files;
    if (role.gate.enabled && role.gate.key.empty()) {
      files = CollectKeyFiles(role, options.launcher_env);
      key = DeriveGateKey(role, config.model, torch, options.launcher_env, files, gpu, rp.cpu_identity);
    } else if (role.gate.enabled) {
      key = role.gate.key;
    }
    rp.key_files = files;
    keys.push_back(key);
  }
  return keys;
}

/// One ProcessPlan per (role, device) on this node, with its global and role ranks: node by node (torchrun's
/// order), then role by role, then device by device.
void PlaceProcesses(const RunConfig& config, const PlanOptions& options, const std::vector<std::string>& inherited,
                    const std::vector<std::string>& keys, Plan* out) {
  Plan& plan = *out;
  int rank = 0;
  for (int node = 0; node < options.nnodes; ++node) {
    for (size_t ri = 0; ri < config.roles.size(); ++ri) {
      const RoleSpec& role = config.roles[ri];
      if (!role.RunsOnNode(node)) continue;
      if (plan.roles[ri].first_node < 0) plan.roles[ri].first_node = node;
      for (int i = 0; i < role.process_count(); ++i) {
        int role_rank = plan.roles[ri].world_size++;
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
        p.ports.assign(role.ports.size(), 0);  // reserved when the run starts
        plan.processes.push_back(std::move(p));
      }
    }
  }
  plan.world_size = rank;
  plan.local_world_size = static_cast<int>(plan.processes.size());
  for (ProcessPlan& p : plan.processes) p.role_world_size = plan.roles[p.role_index].world_size;
}

/// The warm-up of each gated role in gate mode "warmup" that runs here: a world of one, as its first process.
void PlanWarmups(const RunConfig& config, Plan* out) {
  Plan& plan = *out;
  // Each node warms up the gated roles it runs, as their first process here would run.
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
      plan.roles[ri].warmup_master_port = plan.master_port + 1 + static_cast<int>(config.roles.size() + ri);
  }
}

/// What the launcher's own environment leaves to us: OMP threads, device order, leader compile threads.
void HostDefaults(const PlanOptions& options, Plan* out) {
  Plan& plan = *out;
  bool launcher_sets_omp = false;
  for (const auto& [k, v] : options.launcher_env) launcher_sets_omp |= k == env::kOmpNumThreads;
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
  for (const auto& [k, v] : options.launcher_env)
    if (const env::ProcessVar* var = env::FindProcessVar(k); var && var->kind == env::VarKind::kDefault)
      plan.launcher_defaults.push_back(k);
}

}  // namespace

Plan BuildPlan(const RunConfig& config, const PlanOptions& options) {
  Plan plan;
  plan.config = config;
  PlaceRun(config, options, &plan);
  for (const auto& [k, v] : options.launcher_env)
    if (k == "CUDA_VISIBLE_DEVICES") plan.inherited_visible_devices = v;
  std::vector<std::string> inherited = plan.inherited_visible_devices.empty()
                                           ? std::vector<std::string>{}
                                           : SplitVisibleDevices(plan.inherited_visible_devices);
  plan.host_gpus = options.host_gpus;
  std::vector<std::string> keys = PlanRoles(config, options, inherited, &plan);
  PlaceProcesses(config, options, inherited, keys, &plan);
  PlanWarmups(config, &plan);
  HostDefaults(options, &plan);
  return plan;
}

int Plan::FirstNode() const {
  int first = -1;
  for (const RolePlan& r : roles)
    if (r.first_node >= 0 && (first < 0 || r.first_node < first)) first = r.first_node;
  return first;
}

std::string Plan::AttemptPath(const ProcessPlan& p, int attempt, const std::string& suffix) const {
  return run_dir + "/attempt_" + std::to_string(attempt_base + attempt) + "/" + p.role + "-" +
         (p.warmup ? std::string("warmup") : std::to_string(p.role_rank)) + "." + suffix;
}

std::string Plan::SpoolDir() const {
  // /dev/shm is per host, and two node launchers may share one (tests, a fat node).
  return config.run.spool_dir + "/" + run_id + (nnodes > 1 ? "/node_" + std::to_string(node_rank) : "");
}

std::string Plan::CheckpointDir(const ProcessPlan& p) const {
  return (config.run.checkpoint_dir.empty() ? run_dir + "/checkpoints" : config.run.checkpoint_dir) + "/" + p.role;
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

std::string GateSources(const RolePlan& role) {
  std::string sources;
  for (const KeyFile& f : role.key_files)
    if (!f.path.empty() && f.path.find('\n') == std::string::npos)
      sources += (f.sha256.empty() ? "-" : f.sha256) + " " + f.path + "\n";
  return sources;
}

std::vector<std::string> Plan::ExecArgv(const ProcessPlan& p) const {
  if (!NeedsWorker(p)) return p.command;
  return EncodeWorkerArgv(bin_dir + "/dflash-worker", WorkerArgsFor(p, /*gated=*/!p.gate_key.empty() &&
                                                                     (p.warmup || !RoleOf(p).warmup_gated())));
}

WorkerArgs Plan::WorkerArgsFor(const ProcessPlan& p, bool gated) const {
  const RoleSpec& role = RoleOf(p);
  WorkerArgs w;
  w.name = p.name;
  if (gated) {
    w.gate_dir = config.run.cache_dir;
    w.gate_key = p.gate_key;
    w.gate_timeout = role.gate.timeout;
    w.gate_idle_hint = role.gate.idle_hint;
    w.warmup = p.warmup;
    w.torch_version = roles[p.role_index].torch_version;
    w.gate_sources = GateSources(roles[p.role_index]);
    w.gpu_identity = roles[p.role_index].gpu_identity;
    bool role_sets_threads = std::any_of(role.env.begin(), role.env.end(),
                                         [](const auto& kv) { return kv.first == env::kInductorCompileThreads; });
    if (!role_sets_threads) w.leader_compile_threads = leader_compile_threads;
  }
  w.ready = role.ready;
  w.command = p.command;
  return w;
}

}  // namespace dflash
