// The resolved plan: one entry per process (role, device) with everything it
// will get. `dflash-launch check` prints it; the supervisor spawns from it.
#pragma once

#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "common/cpu_identity.h"
#include "common/private_files.h"
#include "launcher/config/config.h"
#include "launcher/plan/gate_key_files.h"
#include "launcher/plan/gpu_inventory.h"
#include "launcher/plan/process_env.h"
#include "worker/protocol.h"

namespace dflash {

struct ProcessPlan {
  std::string name;  // "drafter:1"
  std::string role;
  size_t role_index = 0;
  int role_rank = 0;
  int role_world_size = 0;
  int rank = 0;
  int gpu = -1;                      // the one GPU it sees as cuda:0, as an index; -1 for CPU (or a UUID)
  /// Its GPU as written in `devices` ("3", "GPU-…", "MIG-…"); empty for a CPU process.
  std::string device;
  /// What CUDA_VISIBLE_DEVICES gets: `device`, or the entry it indexes in an
  /// inherited CUDA_VISIBLE_DEVICES (Slurm gres, a container runtime); "" for CPU.
  std::string visible_device;
  bool on_gpu() const { return !device.empty(); }
  std::vector<std::string> command;  // the payload (for a builtin: dflash-builtin <role>)
  /// Its role's named ports (RoleSpec::ports), one per name: reserved for the
  /// whole run by ReservePlanPorts, so every attempt gets the same ones; 0
  /// until then (`check` shows <auto>). A warm-up has ports of its own.
  std::vector<int> ports;
  std::string gate_key;              // empty if ungated
  /// The warm-up of a role in gate mode "warmup" ("drafter:warmup"): compiles
  /// under the gate in a world of one before the role's processes start.
  bool warmup = false;
};

struct PlanOptions {
  std::string run_id = "<run_id>";   // `check` shows placeholders; `run` makes a real one
  std::string bin_dir;               // where dflash-worker and dflash-builtin are
  /// torch's version as the role's processes will see it (part of the gate key).
  std::function<std::string(const RoleSpec&)> torch_version;
  /// The launcher's environment: TORCHINDUCTOR_* & co. in it change the gate key.
  EnvList launcher_env;
  /// For a gated GPU role: "cuda <v> triton <v>" from its interpreter (CudaRuntimeFor), part of its GPU identity.
  std::function<std::string(const RoleSpec&)> cuda_runtime;
  /// This host's GPUs (ProbeGpus; empty, nvml false: unknown): the models in the GPU identity, shown by `check`.
  GpuInventory host_gpus;
  /// Where this launcher sits among the run's nodes (docs/multinode.md): one
  /// dflash-launch per node; ranks are global, node by node, then role by role.
  int nnodes = 1;
  int node_rank = 0;
  std::string master_addr;  // empty: [run] master_addr
  int master_port = -1;     // -1: [run] master_port; 0: auto; else this port (e.g. the scheduler's MASTER_PORT)
  std::string store;        // --store: "private" or a redis:// URL; empty: [run] store
  /// The CPU this node's processes compile for (common/cpu_identity.h): this host's; a test that compares
  /// derived keys with recorded ones names a fixed one.
  CpuFacts host_cpu = HostCpu();
};

/// What the plan decided for one role (Plan::roles, one per [[role]], in order).
struct RolePlan {
  std::string torch_version;  ///< torch's version as its processes see it (gated roles here; else empty)
  /// What a compile is trusted for, in its derived key, READY records and archives: "cpu", or the GPU model(s)
  /// with compute capability and the CUDA/Triton versions ("NVIDIA H200 sm 9.0; cuda 13.0 triton 3.6.0");
  /// empty for an ungated role.
  std::string gpu_identity;
  /// The CPU its processes compile for (common/cpu_identity.h: this host's CPU and the ATEN_CPU_CAPABILITY they
  /// run with), in its derived key, READY records and archives, for every role.
  std::string cpu_identity;
  /// TORCH_COMPILE_CACHE_KEY_TAG of its processes: the user's own tag (role env, else the launcher's) with
  /// cpu_identity's tag, so no process loads an Inductor entry compiled for another CPU or ISA.
  std::string cache_key_tag;
  std::vector<KeyFile> key_files;  ///< the files in its derived gate key
  int master_port = 0;         ///< ROLE_MASTER_PORT; 0 while "auto" is not resolved
  int warmup_master_port = 0;  ///< its warm-up's own MASTER_PORT; 0 likewise (or none)
  int world_size = 0;          ///< its processes on every node
  int first_node = -1;         ///< the node of its role rank 0 (-1: none)
};

struct Plan {
  RunConfig config;
  std::string run_id;
  std::string run_dir;  // <log_dir>/<run_id>
  /// `run --resume` of a run id that already has attempt dirs: this launch's
  /// attempt k writes attempt_<attempt_base + k>/ (the old ones stay as they are).
  int attempt_base = 0;
  bool resumed = false;  // `run --resume` found the run dir there: events.jsonl gets a "resume" line
  std::string bin_dir;
  std::vector<RolePlan> roles;  // one per config.roles, in its order
  /// One per role in gate mode "warmup" (RoleSpec::warmup_gated), run before
  /// that role's processes start. Not part of the world: no rank of its own.
  std::vector<ProcessPlan> warmups;
  std::vector<ProcessPlan> processes;           // this node's
  int nnodes = 1;
  int node_rank = 0;
  int world_size = 0;        // processes on every node (WORLD_SIZE)
  int local_world_size = 0;  // processes on this node (LOCAL_WORLD_SIZE)
  std::string master_addr;
  /// 0 while "auto" is not resolved yet: `check` shows <auto>; `run` picks one (ReservePorts).
  int master_port = 0;
  /// OMP_NUM_THREADS=1 for processes whose role does not set it: several share
  /// this host and the launcher's env does not set it (torchrun's default).
  bool default_omp_threads = false;
  /// TORCHINDUCTOR_COMPILE_THREADS for a gate's leader (followers get 1): this host's
  /// CPUs shared by the gates that may compile at once here, at most Inductor's own 32;
  /// 0 when the launcher's env sets the variable (then each role's own or inherited value holds).
  int leader_compile_threads = 0;
  /// CUDA_DEVICE_ORDER=PCI_BUS_ID for GPU processes (nvidia-smi's and NVML's order, not
  /// CUDA's fastest-first) unless the launcher's env sets it.
  bool default_device_order = false;
  /// The launcher's CUDA_VISIBLE_DEVICES when it has one (not empty): `devices` index into it.
  std::string inherited_visible_devices;
  /// This host's GPUs from NVML (filled by the commands when a GPU process runs here; `check` shows them).
  GpuInventory host_gpus;
  /// The GPU a process gets, as NVML names it (nullptr: no NVML, or a MIG slice / unknown UUID).
  const GpuInfo* HostGpuOf(const ProcessPlan& p) const;
  /// The defaults (env::VarKind::kDefault) the launcher's own environment
  /// sets: its value wins, so ProcessEnv leaves them out.
  std::vector<std::string> launcher_defaults;
  /// The coordination store (docs/multinode.md): "" (static mode), "private" or a redis:// URL.
  std::string store;
  /// "private": the port node 0's redis-server listens on, on MASTER_ADDR (0 while not resolved:
  /// one node picks a free one as it starts; several nodes derive it from MASTER_PORT).
  int store_port = 0;
  /// A run without a store of its own: DFLASH_STORE from the launcher's
  /// environment, the cluster-wide gate's store alone (docs/multinode.md). Read
  /// as an input and passed on as DFLASH_STORE, shown by `check`; "" if unset.
  std::string gate_store;
  /// With gate_store: its secret's file and ACL user from the launcher's environment
  /// (DFLASH_STORE_SECRET_FILE, DFLASH_STORE_USER), passed on the same way.
  std::string gate_store_secret_file, gate_store_user;
  bool store_private() const { return store == "private"; }
  /// DFLASH_STORE: where the store is (redis://...), "" without one; "<auto>" for a private port not chosen yet.
  std::string StoreUrlText() const;

  /// The first node that runs any process: where rank 0 and MASTER_ADDR are.
  int FirstNode() const;
  /// Whether this node binds the port: it hosts rank 0 (role < 0) or the role's role rank 0.
  bool BindsMasterPort() const { return FirstNode() == node_rank; }
  bool BindsRolePort(size_t role) const { return roles[role].first_node == node_rank; }

  const RoleSpec& RoleOf(const ProcessPlan& p) const { return config.roles[p.role_index]; }
  /// How the run's dirs and files are made: private (0700/0600), or [run] log_group's.
  FileMode Files() const {
    return config.run.log_gid == static_cast<gid_t>(-1) ? FileMode::Private() : FileMode::Group(config.run.log_gid);
  }
  /// <run_dir>/attempt_<attempt_base + k>/<role>-<rank>.<suffix>
  std::string AttemptPath(const ProcessPlan& p, int attempt, const std::string& suffix) const;
  /// Every variable dflash-launch sets for this process on this attempt, in a
  /// stable order (launcher/plan/process_env.cc); the rest of the environment
  /// is the launcher's own, without the variables it owns (SpawnEnvironment).
  /// Without `spawn` (`check`), what only the spawner knows is a placeholder.
  EnvList ProcessEnv(const ProcessPlan& p, int attempt, const SpawnContext* spawn = nullptr) const;
  /// Hidden-state frames of this run: <run.spool_dir>/<run_id> (DFLASH_SPOOL_DIR).
  std::string SpoolDir() const;
  /// Checkpoints of `p`'s role: <run.checkpoint_dir, default <run_dir>/checkpoints>/<role> (DFLASH_CHECKPOINT_DIR).
  std::string CheckpointDir(const ProcessPlan& p) const;
  /// Processes that publish frames there: those of roles with spool = "produce" or a builtin
  /// target, warm-ups not counted (they publish nothing) (DFLASH_SPOOL_PRODUCERS).
  int SpoolProducers() const;
  /// DFLASH_<ROLE>_<NAME>_PORTS of role `role`'s port `name`: its processes' on this node, in role-rank
  /// order ("<auto>" for one not reserved yet). Several nodes: the other nodes' are not known here.
  std::string RolePortsList(size_t role, size_t name) const;
  /// Whether the process needs dflash-worker in between: for the gate, or a
  /// readiness only a host can observe (log lines, a file). Otherwise the
  /// supervisor executes the payload itself and sees its readiness (none,
  /// notify, exit) and its exit status first-hand: one exec less per process.
  bool NeedsWorker(const ProcessPlan& p) const;
  /// What the supervisor executes: dflash-worker with the gate/ready options
  /// and then the payload, or the payload alone (see NeedsWorker).
  /// What dflash-worker is told for `p` (`gated`: it takes the gate, with every gate input the plan knows:
  /// WorkerArgs is their one channel).
  WorkerArgs WorkerArgsFor(const ProcessPlan& p, bool gated) const;
  std::vector<std::string> ExecArgv(const ProcessPlan& p) const;
};

/// Whether `nnodes`/`node_rank` place the config sensibly: node_rank < nnodes,
/// every role's `nodes` exist, node 0 and this node run something. False: `err` says why.
bool CheckPlacement(const RunConfig& config, int nnodes, int node_rank, std::string* err);

/// Gated (Python) roles whose processes would run with Dynamo's precompile cache (TORCH_CACHING_PRECOMPILE=1 in
/// the role's or the launcher's environment): it computes wrong values (docs/cachelock.md, "What is exact").
std::vector<ConfigError> CheckNoPrecompile(const RunConfig& config, const PlanOptions& options);

/// REQUIRES: CheckPlacement(config, options.nnodes, options.node_rank).
Plan BuildPlan(const RunConfig& config, const PlanOptions& options);

/// The ports of a multi-node run with master_port = "auto": every node derives
/// the same ones from the shared run id, in [20000, 32767) (below Linux's
/// ephemeral range, where outgoing connections take their source ports).
int DerivedMasterPort(const std::string& run_id, size_t roles);
/// A private store's port with several nodes: after MASTER_PORT, the role ports and the warm-up ports.
int PrivateStorePort(int master_port, size_t roles);

/// The default gate key: "<role>-<16 hex>" over the role name, the [model]
/// contract, torch's version, the GPU identity (RolePlan::gpu_identity), the command, the content of the files it runs
/// (`files`: the script and gate.key_files) and every TORCHINDUCTOR_*,
/// TORCH_COMPILE_*, TORCHDYNAMO_* and TRITON_* variable (launcher env, then role env).
std::string DeriveGateKey(const RoleSpec& role, const ModelSpec& model, const std::string& torch_version,
                          const EnvList& launcher_env, const std::vector<KeyFile>& files = {},
                          const std::string& gpu_identity = "", const std::string& cpu_identity = "");

/// A derived key's files for the worker's --gate-sources: one "<sha256 or -> <path>" per line.
std::string GateSources(const RolePlan& role);

/// Whether every role's devices resolve on this node: an index past an inherited
/// CUDA_VISIBLE_DEVICES (or past `gpu_count` when it is >= 0, e.g. NVML's count) and a
/// UUID that an inherited list of UUIDs does not hold are refused. False: `err` says why.
bool CheckDevices(const Plan& plan, int gpu_count, std::string* err);

/// The entries of a CUDA_VISIBLE_DEVICES value, "3,5" -> {"3", "5"} (spaces trimmed).
std::vector<std::string> SplitVisibleDevices(const std::string& value);

/// "1,2000,25600"
std::string JoinInts(const std::vector<int64_t>& v, const char* sep = ",");

}  // namespace dflash
