// Every environment variable dflash-launch and dflash-worker set for a
// process, named once. The plan builds a process's environment from these
// names (launcher/plan/plan.h, Plan::ProcessEnv), the config refuses the owned
// ones in a role's `env`, the supervisor and `seed` drop them from the
// launcher's own environment before they spawn, and payload-side readers
// (dflash-worker, the builtin roles) read them back by these constants, so a
// role's `env` cannot override what the launcher decides, and nothing the
// launcher decides leaks in from the launcher's own environment.
#pragma once

#include <string>
#include <string_view>

namespace dflash::env {

// The torchrun-compatible world (docs/config.md, "Environment").
inline constexpr char kCudaVisibleDevices[] = "CUDA_VISIBLE_DEVICES";
inline constexpr char kLocalRank[] = "LOCAL_RANK";
inline constexpr char kRank[] = "RANK";
inline constexpr char kWorldSize[] = "WORLD_SIZE";
inline constexpr char kLocalWorldSize[] = "LOCAL_WORLD_SIZE";
inline constexpr char kGroupRank[] = "GROUP_RANK";
inline constexpr char kGroupWorldSize[] = "GROUP_WORLD_SIZE";
inline constexpr char kMasterAddr[] = "MASTER_ADDR";
inline constexpr char kMasterPort[] = "MASTER_PORT";
inline constexpr char kRoleName[] = "ROLE_NAME";
inline constexpr char kRoleRank[] = "ROLE_RANK";
inline constexpr char kRoleWorldSize[] = "ROLE_WORLD_SIZE";
inline constexpr char kRoleMasterAddr[] = "ROLE_MASTER_ADDR";
inline constexpr char kRoleMasterPort[] = "ROLE_MASTER_PORT";
inline constexpr char kTorchelasticErrorFile[] = "TORCHELASTIC_ERROR_FILE";
inline constexpr char kTorchelasticRestartCount[] = "TORCHELASTIC_RESTART_COUNT";
// Where the compile cache is.
inline constexpr char kInductorCacheDir[] = "TORCHINDUCTOR_CACHE_DIR";
inline constexpr char kTritonCacheDir[] = "TRITON_CACHE_DIR";
// The run and this process in it.
inline constexpr char kRunId[] = "DFLASH_RUN_ID";
inline constexpr char kRunDir[] = "DFLASH_RUN_DIR";
inline constexpr char kProcess[] = "DFLASH_PROCESS";
inline constexpr char kAttempt[] = "DFLASH_ATTEMPT";
inline constexpr char kMetricsFile[] = "DFLASH_METRICS_FILE";
inline constexpr char kSpoolDir[] = "DFLASH_SPOOL_DIR";
inline constexpr char kSpoolProducers[] = "DFLASH_SPOOL_PRODUCERS";
// <[run] checkpoint_dir>/<role>: where dflash_launch.Checkpoint (and the builtin drafter) keep checkpoints.
inline constexpr char kCheckpointDir[] = "DFLASH_CHECKPOINT_DIR";
inline constexpr char kSpoolMaxBytes[] = "DFLASH_SPOOL_MAX_BYTES";  // [run] spool_max_bytes, when written
inline constexpr char kNodeRank[] = "DFLASH_NODE_RANK";
inline constexpr char kNnodes[] = "DFLASH_NNODES";
inline constexpr char kStore[] = "DFLASH_STORE";
inline constexpr char kRunToken[] = "DFLASH_RUN_TOKEN";  // common/run_sweep.h kRunTokenVar
inline constexpr char kStoreSecretFile[] = "DFLASH_STORE_SECRET_FILE";  // store/store_auth.h: the password's file
inline constexpr char kStoreUser[] = "DFLASH_STORE_USER";                // store/store_auth.h: its ACL user
inline constexpr char kStorePrivate[] = "DFLASH_STORE_PRIVATE";  // "1": AUTH is PrivateStoreAuthPassword (store_auth.h)
// The compile gate and the warm-up.
inline constexpr char kGateKey[] = "DFLASH_GATE_KEY";
inline constexpr char kWarmup[] = "DFLASH_WARMUP";
inline constexpr char kRunWorldSize[] = "DFLASH_RUN_WORLD_SIZE";
inline constexpr char kRunRoleWorldSize[] = "DFLASH_RUN_ROLE_WORLD_SIZE";
inline constexpr char kGateRole[] = "DFLASH_GATE_ROLE";      // dflash-worker: lead or reuse
inline constexpr char kGateHolder[] = "DFLASH_GATE_HOLDER";  // dflash-worker: cachelock/holder_tree.h
// GPUs and compile workers.
inline constexpr char kCudaDeviceOrder[] = "CUDA_DEVICE_ORDER";
inline constexpr char kInductorCompileThreads[] = "TORCHINDUCTOR_COMPILE_THREADS";
// Dynamo's precompile cache: never set by us, and refused where a process is gated (it computes wrong values:
// docs/cachelock.md, "What is exact"); the plan and dflash-worker check it.
inline constexpr char kTorchCachingPrecompile[] = "TORCH_CACHING_PRECOMPILE";
// The CPU in every compile key (common/cpu_identity.h): torch.compiler.config.cache_key_tag, which Inductor's
// FX-graph and AOTAutograd keys hash, carries the CPU identity of each process; ATEN_CPU_CAPABILITY picks the
// vector ISA Inductor compiles for, so it is part of that identity.
inline constexpr char kTorchCompileCacheKeyTag[] = "TORCH_COMPILE_CACHE_KEY_TAG";
inline constexpr char kAtenCpuCapability[] = "ATEN_CPU_CAPABILITY";
// The [model] contract.
inline constexpr char kHiddenShape[] = "DFLASH_HIDDEN_SHAPE";
inline constexpr char kTappedLayers[] = "DFLASH_TAPPED_LAYERS";
inline constexpr char kTargetLayers[] = "DFLASH_TARGET_LAYERS";
inline constexpr char kHidden[] = "DFLASH_HIDDEN";
inline constexpr char kDraftLayers[] = "DFLASH_DRAFT_LAYERS";
inline constexpr char kBlockSize[] = "DFLASH_BLOCK_SIZE";
inline constexpr char kSeqLen[] = "DFLASH_SEQ_LEN";
inline constexpr char kBatch[] = "DFLASH_BATCH";
inline constexpr char kDtype[] = "DFLASH_DTYPE";
inline constexpr char kVocab[] = "DFLASH_VOCAB";
inline constexpr char kSeed[] = "DFLASH_SEED";
inline constexpr char kHeads[] = "DFLASH_HEADS";
inline constexpr char kKvHeads[] = "DFLASH_KV_HEADS";
// A role's named ports (`ports = ["http"]`, docs/config.md "Ports"): one name per port name,
// so these are families (kProcessVarFamilies below), built by PortVar and RolePortsVar.
inline constexpr char kPortPrefix[] = "DFLASH_PORT_";  // DFLASH_PORT_<NAME>: this process's own port
inline constexpr char kRolePortsPrefix[] = "DFLASH_";  // DFLASH_<ROLE>_<NAME>_PORTS: a role's, p0,p1,...
inline constexpr char kRolePortsSuffix[] = "_PORTS";
// The supervisor's side channel.
inline constexpr char kNotifySocket[] = "NOTIFY_SOCKET";
inline constexpr char kWatchdogUsec[] = "WATCHDOG_USEC";
// Defaults: set unless the role's `env` or the launcher's own environment sets them.
inline constexpr char kPythonUnbuffered[] = "PYTHONUNBUFFERED";
inline constexpr char kPythonFaultHandler[] = "PYTHONFAULTHANDLER";
inline constexpr char kOmpNumThreads[] = "OMP_NUM_THREADS";

enum class VarKind {
  /// dflash-launch or dflash-worker decides the value: refused in a role's
  /// `env`, never inherited from the launcher's own environment.
  kOwned,
  /// A default: the role's `env`, else the launcher's environment, wins.
  kDefault,
};

struct ProcessVar {
  const char* name;
  VarKind kind;
};

/// Every variable above, in one table: what tests and the config check walk.
inline constexpr ProcessVar kProcessVars[] = {
    {kCudaVisibleDevices, VarKind::kOwned}, {kLocalRank, VarKind::kOwned},
    {kRank, VarKind::kOwned},               {kWorldSize, VarKind::kOwned},
    {kLocalWorldSize, VarKind::kOwned},     {kGroupRank, VarKind::kOwned},
    {kGroupWorldSize, VarKind::kOwned},     {kMasterAddr, VarKind::kOwned},
    {kMasterPort, VarKind::kOwned},         {kRoleName, VarKind::kOwned},
    {kRoleRank, VarKind::kOwned},           {kRoleWorldSize, VarKind::kOwned},
    {kRoleMasterAddr, VarKind::kOwned},     {kRoleMasterPort, VarKind::kOwned},
    {kTorchelasticErrorFile, VarKind::kOwned}, {kTorchelasticRestartCount, VarKind::kOwned},
    {kInductorCacheDir, VarKind::kOwned},   {kTritonCacheDir, VarKind::kOwned},
    {kRunId, VarKind::kOwned},              {kRunDir, VarKind::kOwned},
    {kProcess, VarKind::kOwned},            {kAttempt, VarKind::kOwned},
    {kMetricsFile, VarKind::kOwned},        {kSpoolDir, VarKind::kOwned},
    {kSpoolProducers, VarKind::kOwned},     {kSpoolMaxBytes, VarKind::kOwned},
    {kNodeRank, VarKind::kOwned},           {kCheckpointDir, VarKind::kOwned},
    {kNnodes, VarKind::kOwned},             {kStore, VarKind::kOwned},
    {kRunToken, VarKind::kOwned},           {kGateKey, VarKind::kOwned},
    {kStoreSecretFile, VarKind::kOwned},    {kStoreUser, VarKind::kOwned},
    {kStorePrivate, VarKind::kOwned},
    {kWarmup, VarKind::kOwned},
    {kRunWorldSize, VarKind::kOwned},       {kRunRoleWorldSize, VarKind::kOwned},
    {kGateRole, VarKind::kOwned},           {kGateHolder, VarKind::kOwned},
    {kHiddenShape, VarKind::kOwned},        {kTappedLayers, VarKind::kOwned},
    {kTargetLayers, VarKind::kOwned},       {kHidden, VarKind::kOwned},
    {kDraftLayers, VarKind::kOwned},        {kBlockSize, VarKind::kOwned},
    {kSeqLen, VarKind::kOwned},             {kBatch, VarKind::kOwned},
    {kDtype, VarKind::kOwned},              {kVocab, VarKind::kOwned},
    {kSeed, VarKind::kOwned},               {kHeads, VarKind::kOwned},
    {kKvHeads, VarKind::kOwned},            {kNotifySocket, VarKind::kOwned},
    {kWatchdogUsec, VarKind::kOwned},       {kPythonUnbuffered, VarKind::kDefault},
    {kPythonFaultHandler, VarKind::kDefault}, {kOmpNumThreads, VarKind::kDefault},
    {kCudaDeviceOrder, VarKind::kDefault},  {kInductorCompileThreads, VarKind::kDefault},
    // The role's (else the launcher's) value is kept inside the one dflash-launch sets, the CPU's tag after it.
    {kTorchCompileCacheKeyTag, VarKind::kDefault},
};

/// A family of names dflash-launch sets: every name with this prefix and suffix
/// (and something between them), whatever the config names.
struct ProcessVarFamily {
  const char* prefix;
  const char* suffix;
  VarKind kind;
};

inline constexpr ProcessVarFamily kProcessVarFamilies[] = {
    {kPortPrefix, "", VarKind::kOwned},
    {kRolePortsPrefix, kRolePortsSuffix, VarKind::kOwned},
};

/// The family `name` belongs to, or nullptr.
constexpr const ProcessVarFamily* FindProcessVarFamily(std::string_view name) {
  for (const ProcessVarFamily& f : kProcessVarFamilies) {
    std::string_view prefix(f.prefix), suffix(f.suffix);
    if (name.size() > prefix.size() + suffix.size() && name.substr(0, prefix.size()) == prefix &&
        name.substr(name.size() - suffix.size()) == suffix)
      return &f;
  }
  return nullptr;
}

/// A name as a variable part: upper-cased, anything but a letter or digit -> '_' ("drafter-2" -> "DRAFTER_2").
inline std::string VarPart(std::string_view s) {
  std::string out(s);
  for (char& c : out) {
    if (c >= 'a' && c <= 'z') c = static_cast<char>(c - 'a' + 'A');
    else if (!((c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9'))) c = '_';
  }
  return out;
}

/// DFLASH_PORT_HTTP: the port named "http" of the process that gets it.
inline std::string PortVar(std::string_view port_name) { return kPortPrefix + VarPart(port_name); }

/// DFLASH_SERVE_HTTP_PORTS: every process's port "http" of role "serve", in role-rank order.
inline std::string RolePortsVar(std::string_view role, std::string_view port_name) {
  return kRolePortsPrefix + VarPart(role) + "_" + VarPart(port_name) + kRolePortsSuffix;
}

/// The entry of `name`, or nullptr for a variable dflash-launch never sets.
constexpr const ProcessVar* FindProcessVar(std::string_view name) {
  for (const ProcessVar& v : kProcessVars)
    if (name == v.name) return &v;
  return nullptr;
}

/// Whether dflash-launch or dflash-worker decides `name` (VarKind::kOwned).
constexpr bool IsOwnedVar(std::string_view name) {
  if (const ProcessVar* v = FindProcessVar(name)) return v->kind == VarKind::kOwned;
  const ProcessVarFamily* f = FindProcessVarFamily(name);
  return f && f->kind == VarKind::kOwned;
}

}  // namespace dflash::env
