#include "launcher/plan/process_env.h"

#include <algorithm>

#include "common/run_sweep.h"
#include "common/spawn.h"
#include "contract/env_vars.h"
#include "launcher/plan/plan.h"

namespace dflash {

static_assert(std::string_view(kRunTokenVar) == env::kRunToken, "one name for the run token");

std::vector<std::string> SpawnEnvironment(std::vector<std::string> inherited, const EnvList& process_env) {
  // A DFLASH_WARMUP=1 or DFLASH_GATE_KEY left in the launcher's environment
  // (a shell that ran a payload by hand, a wrapper) must not reach a process
  // the plan did not give one: ungated processes would act as warm-ups.
  inherited.erase(std::remove_if(inherited.begin(), inherited.end(),
                                 [](const std::string& e) { return env::IsOwnedVar(e.substr(0, e.find('='))); }),
                  inherited.end());
  for (const auto& [k, v] : process_env) SetEnvVar(&inherited, k, v);
  return inherited;
}

std::string Plan::RolePortsList(size_t role, size_t name) const {
  std::string list;
  for (const ProcessPlan& q : processes)
    if (q.role_index == role && name < q.ports.size())
      list += (list.empty() ? "" : ",") + (q.ports[name] > 0 ? std::to_string(q.ports[name]) : std::string("<auto>"));
  return list;
}

namespace {

std::string PortText(int port) { return port > 0 ? std::to_string(port) : std::string("<auto>"); }

/// torchrun's variables, and the role's world beside the run's.
EnvList TorchrunWorld(const Plan& plan, const ProcessPlan& p) {
  // Its role world's store runs beside the role's rank 0: on node 0 that is
  // MASTER_ADDR; elsewhere the static mode does not know the address (docs/multinode.md).
  int role_node = plan.roles[p.role_index].first_node;
  // A warm-up is a world of one on this host, with a port of its own: it
  // needs no peer, and no peer of the run can meet it by accident.
  const bool w = p.warmup;
  return {
      {env::kCudaVisibleDevices, p.visible_device},
      // One GPU per process, seen as cuda:0: LOCAL_RANK is the device index inside the process.
      {env::kLocalRank, "0"},
      {env::kRank, std::to_string(p.rank)},
      {env::kWorldSize, w ? "1" : std::to_string(plan.world_size)},
      {env::kLocalWorldSize, w ? "1" : std::to_string(plan.local_world_size)},
      {env::kGroupRank, w ? "0" : std::to_string(plan.node_rank)},
      {env::kGroupWorldSize, w ? "1" : std::to_string(plan.nnodes)},
      {env::kMasterAddr, w ? "127.0.0.1" : plan.master_addr},
      {env::kMasterPort, PortText(w ? plan.roles[p.role_index].warmup_master_port : plan.master_port)},
      {env::kRoleName, p.role},
      {env::kRoleRank, std::to_string(p.role_rank)},
      {env::kRoleWorldSize, std::to_string(p.role_world_size)},
      {env::kRoleMasterAddr, w ? "127.0.0.1" : role_node == 0 || plan.nnodes == 1 ? plan.master_addr : std::string()},
      {env::kRoleMasterPort,
       PortText(w ? plan.roles[p.role_index].warmup_master_port : plan.roles[p.role_index].master_port)},
  };
}

/// The caches, torchelastic's files, the run's files and places (DFLASH_*), and the named ports.
void AddRunFilesAndPorts(const Plan& plan, const ProcessPlan& p, int attempt, EnvList* e) {
  const RunSpec& run = plan.config.run;
  e->insert(e->end(), {
                          {env::kInductorCacheDir, run.cache_dir},
                          {env::kTritonCacheDir, run.cache_dir + "/triton"},
                          {env::kTorchelasticErrorFile, plan.AttemptPath(p, attempt, "error.json")},
                          {env::kTorchelasticRestartCount, std::to_string(attempt)},
                          {env::kRunId, plan.run_id},
                          {env::kRunDir, plan.run_dir},
                          {env::kProcess, p.name},
                          {env::kAttempt, std::to_string(attempt)},
                          {env::kMetricsFile, plan.AttemptPath(p, attempt, "metrics.json")},
                          {env::kSpoolDir, plan.SpoolDir()},
                          {env::kSpoolProducers, std::to_string(plan.SpoolProducers())},
                          {env::kCheckpointDir, plan.CheckpointDir(p)},
                          {env::kNodeRank, std::to_string(plan.node_rank)},
                          {env::kNnodes, std::to_string(plan.nnodes)},
                      });
  if (run.spool_max_bytes > 0) e->emplace_back(env::kSpoolMaxBytes, std::to_string(run.spool_max_bytes));
  // Named ports: its own, and those of every role's processes here, so a peer finds them (docs/config.md "Ports").
  const RoleSpec& role = plan.RoleOf(p);
  for (size_t i = 0; i < role.ports.size() && i < p.ports.size(); ++i)
    e->emplace_back(env::PortVar(role.ports[i]), PortText(p.ports[i]));
  for (size_t ri = 0; ri < plan.config.roles.size(); ++ri)
    for (size_t i = 0; i < plan.config.roles[ri].ports.size(); ++i)
      e->emplace_back(env::RolePortsVar(plan.config.roles[ri].name, plan.config.roles[ri].ports[i]),
                      plan.RolePortsList(ri, i));
}

/// The supervisor's notify socket and run token, and the run's store with its secret.
void AddSocketsAndStore(const Plan& plan, const SpawnContext* spawn, EnvList* e) {
  const RunSpec& run = plan.config.run;
  // The worker reports here, never to systemd; the token marks the process's
  // whole tree for the guardian (common/run_sweep.h).
  if (!spawn || !spawn->notify_socket.empty())
    e->emplace_back(env::kNotifySocket, spawn ? spawn->notify_socket : "<the supervisor's notify socket>");
  if (!spawn || !spawn->run_token.empty()) e->emplace_back(env::kRunToken, spawn ? spawn->run_token : "<run token>");
  // The cluster-wide compile gate (worker) and payloads find the run's store here.
  if (!plan.store.empty()) e->emplace_back(env::kStore, plan.StoreUrlText());
  else if (!plan.gate_store.empty()) e->emplace_back(env::kStore, plan.gate_store);
  // Its password, in a 0600 file the launcher writes (launcher/cluster/store_session.h): a path here,
  // never the secret, so neither `check` nor /proc/<pid>/environ shows it.
  if (!plan.store.empty() &&
      (plan.store_private() || !run.store_password_file.empty() || !run.store_password_env.empty()))
    e->emplace_back(env::kStoreSecretFile, plan.run_dir + "/store.secret");
  if (!plan.store.empty() && !run.store_user.empty()) e->emplace_back(env::kStoreUser, run.store_user);
  // A private store takes a password derived from that secret and the run id, not the secret (store_auth.h).
  if (plan.store_private()) e->emplace_back(env::kStorePrivate, "1");
  if (plan.store.empty() && !plan.gate_store.empty()) {
    if (!plan.gate_store_secret_file.empty()) e->emplace_back(env::kStoreSecretFile, plan.gate_store_secret_file);
    if (!plan.gate_store_user.empty()) e->emplace_back(env::kStoreUser, plan.gate_store_user);
  }
}

/// A warm-up's mark and the worlds it stands in for; a gated process's key and what READY records.
void AddWarmupAndGate(const Plan& plan, const ProcessPlan& p, EnvList* e) {
  if (p.warmup) {
    e->emplace_back(env::kWarmup, "1");
    // The worlds it stands in for: a graph with collectives inside it needs
    // their real sizes (dflash_launch.init_process_group(fake_world_in_warmup=True)).
    e->emplace_back(env::kRunWorldSize, std::to_string(plan.world_size));
    e->emplace_back(env::kRunRoleWorldSize, std::to_string(plan.roles[p.role_index].world_size));
  }
  if (p.gate_key.empty()) return;
  e->emplace_back(env::kGateKey, p.gate_key);
  // What the worker records in READY (torch, the key's files, the GPU identity) goes by its flags: WorkerArgs.
}

/// The [model] contract, for the builtin roles and any payload that reads it.
void AddModel(const ModelSpec& m, EnvList* e) {
  std::vector<int64_t> taps(m.tapped_layers.begin(), m.tapped_layers.end());
  e->insert(e->end(), {
                          {env::kHiddenShape, JoinInts(m.HiddenShape())},
                          {env::kTappedLayers, JoinInts(taps)},
                          {env::kTargetLayers, std::to_string(m.target_layers)},
                          {env::kHidden, std::to_string(m.hidden)},
                          {env::kDraftLayers, std::to_string(m.draft_layers)},
                          {env::kBlockSize, std::to_string(m.block_size)},
                          {env::kSeqLen, std::to_string(m.seq_len)},
                          {env::kBatch, std::to_string(m.batch)},
                          {env::kDtype, m.dtype},
                          {env::kVocab, std::to_string(m.vocab)},
                          {env::kSeed, std::to_string(m.seed)},
                      });
  if (m.heads > 0) e->emplace_back(env::kHeads, std::to_string(m.heads));
  if (m.kv_heads > 0) e->emplace_back(env::kKvHeads, std::to_string(m.kv_heads));
}

/// Defaults, each unless the role's env or the launcher's own sets it.
void AddDefaults(const Plan& plan, const ProcessPlan& p, EnvList* e) {
  const RoleSpec& role = plan.RoleOf(p);
  auto set_default = [&](const char* name, const std::string& value) {
    bool role_sets = std::any_of(role.env.begin(), role.env.end(), [&](const auto& kv) { return kv.first == name; });
    bool launcher_sets =
        std::find(plan.launcher_defaults.begin(), plan.launcher_defaults.end(), name) != plan.launcher_defaults.end();
    if (!role_sets && !launcher_sets) e->emplace_back(name, value);
  };
  // Gated and log-watched processes are judged by what they say when they say
  // it: Python's block-buffered stdout on a pipe would hold a READY line back.
  if (!p.gate_key.empty() || role.ready.mode == ReadyMode::kLog) set_default(env::kPythonUnbuffered, "1");
  // A watched Python payload dumps its stacks when its watchdog signal comes (a liveness probe's hang too).
  if (role.watchdog.count() > 0 || role.liveness.enabled) set_default(env::kPythonFaultHandler, "1");
  // torchrun's default: processes sharing a host would each start one OpenMP thread per core.
  if (plan.default_omp_threads) set_default(env::kOmpNumThreads, "1");
  // devices = [3] means what nvidia-smi and NVML call GPU 3 (CUDA's default order is fastest first).
  if (p.on_gpu() && plan.default_device_order) set_default(env::kCudaDeviceOrder, "PCI_BUS_ID");
  // One compile pool's worth of workers: a follower reuses the leader's kernels with one worker;
  // dflash-worker gives its payload the leader's share once the gate makes it the leader.
  bool role_sets_threads = std::any_of(role.env.begin(), role.env.end(),
                                       [](const auto& kv) { return kv.first == env::kInductorCompileThreads; });
  if (!p.gate_key.empty() && plan.leader_compile_threads > 0 && !role_sets_threads) {
    set_default(env::kInductorCompileThreads, "1");  // the leader's share: --leader-compile-threads
  }
}

}  // namespace

EnvList Plan::ProcessEnv(const ProcessPlan& p, int attempt, const SpawnContext* spawn) const {
  const RoleSpec& role = RoleOf(p);
  EnvList e = TorchrunWorld(*this, p);
  AddRunFilesAndPorts(*this, p, attempt, &e);
  AddSocketsAndStore(*this, spawn, &e);
  AddWarmupAndGate(*this, p, &e);
  if (config.model.present) AddModel(config.model, &e);
  // WATCHDOG_USEC (systemd's name): the payload knows it is watched, and how
  // often to send WATCHDOG=1; dflash-worker relays those pings when it is set.
  if (role.watchdog.count() > 0 && (!spawn || spawn->watched))
    e.emplace_back(env::kWatchdogUsec, std::to_string(role.watchdog.count() * 1000));
  AddDefaults(*this, p, &e);
  e.insert(e.end(), role.env.begin(), role.env.end());
  // After the role's env: its own tag is inside ours (RolePlan::cache_key_tag), never instead of it.
  if (!roles[p.role_index].cache_key_tag.empty())
    e.emplace_back(env::kTorchCompileCacheKeyTag, roles[p.role_index].cache_key_tag);
  return e;
}

}  // namespace dflash
