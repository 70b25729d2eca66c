// The run.toml model: what a run is made of, after parsing and validation.
// The keys, their types, defaults and docs live in one place: schema.cc.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <csignal>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "common/duration.h"
#include "contract/enum_names.h"
#include "contract/ready_spec.h"
#include "launcher/config/config_error.h"

namespace dflash {

enum class RestartPolicy { kNever, kOnFailure, kAlways };
enum class RestartScope { kProcess, kRole, kAll };
/// The spellings (run.toml, plans, summaries), written once: the parser, the
/// printers and the schema's `choices` all read these tables.
inline constexpr EnumName<RestartPolicy> kRestartPolicyNames[] = {
    {RestartPolicy::kNever, "never"}, {RestartPolicy::kOnFailure, "on-failure"}, {RestartPolicy::kAlways, "always"}};
inline constexpr EnumName<RestartScope> kRestartScopeNames[] = {
    {RestartScope::kProcess, "process"}, {RestartScope::kRole, "role"}, {RestartScope::kAll, "all"}};

/// The torch.distributed world a role's processes join (the payload decides;
/// the launcher cannot see it, so the config says it): its members are one
/// restart unit, since a lone rank restarted into a live world cannot rejoin it.
enum class TorchWorld {
  kNone,  ///< independent processes (or not said)
  kRole,  ///< the role's own world (ROLE_MASTER_PORT): the role restarts together
  kRun,   ///< the run-wide world (MASTER_PORT): every role with world = "run" restarts together
};
inline constexpr EnumName<TorchWorld> kTorchWorldNames[] = {
    {TorchWorld::kNone, "none"}, {TorchWorld::kRole, "role"}, {TorchWorld::kRun, "run"}};
const char* TorchWorldName(TorchWorld w);

const char* RestartPolicyName(RestartPolicy p);
const char* RestartScopeName(RestartScope s);

/// How a gated role's processes meet the gate (docs/cachelock.md, "Gate modes").
enum class GateMode {
  kAuto,    ///< serial for a role of one process, warmup otherwise
  kWarmup,  ///< one warm-up compiles in a world of one; then the whole role starts together
  kSerial,  ///< each process takes the gate as it starts (independent processes only)
};
inline constexpr EnumName<GateMode> kGateModeNames[] = {
    {GateMode::kAuto, "auto"}, {GateMode::kWarmup, "warmup"}, {GateMode::kSerial, "serial"}};
const char* GateModeName(GateMode m);

/// Which of a warmup-gated role's processes wait for its warm-up (docs/cachelock.md, "Who waits").
enum class GateHold {
  kAll,  ///< every process starts after the warm-up
  kOne,  ///< only the role's first process on each node waits: the others start at once and wait in
         ///< init_process_group's rendezvous, which cannot complete without it
};
inline constexpr EnumName<GateHold> kGateHoldNames[] = {{GateHold::kAll, "all"}, {GateHold::kOne, "one"}};
const char* GateHoldName(GateHold h);

/// The compile gate: one process per key compiles, the others wait and reuse.
struct GateSpec {
  bool enabled = false;
  GateMode mode = GateMode::kAuto;
  GateHold hold = GateHold::kAll;
  std::string key;      // empty: derived from role, [model], torch version, command, script, env
  std::vector<std::string> key_files;  // glob patterns (role cwd) whose files go into the derived key
  Millis timeout{};     // how long a follower waits for the gate
  Millis idle_hint{};   // a leader idle this long while we wait: say why (0: never)
};

struct RestartSpec {
  RestartPolicy policy = RestartPolicy::kNever;
  RestartScope scope = RestartScope::kProcess;
  int max = 0;                        // restarts allowed within `window`
  Millis window{};
  Millis backoff_min{}, backoff_max{};
  Millis reset_after{};               // a run this long resets the backoff
  std::vector<int> no_restart_exit_codes;
};

struct StopSpec {
  int signal = SIGTERM;
  Millis grace{};
};

/// The shape contract between the target and the drafters (the `[model]` table).
struct ModelSpec {
  bool present = false;
  int target_layers = 0;
  int hidden = 0;
  std::vector<int> tapped_layers;  // layer i = output of layer i = HF hidden_states[i+1]
  bool tapped_layers_derived = false;
  int draft_layers = 0;
  int block_size = 0;
  int seq_len = 0;
  int batch = 0;
  std::string dtype;
  int heads = 0;      // 0: not given
  int kv_heads = 0;   // 0: not given
  int vocab = 0;
  int64_t seed = 0;

  int NumTaps() const { return static_cast<int>(tapped_layers.size()); }
  /// The drafter input: [batch, seq_len, n_taps * hidden], taps concatenated on the feature axis.
  std::vector<int64_t> HiddenShape() const;
};

/// role.liveness: a network probe of a RUNNING server; `failures` failed tries in a row: hung.
struct LivenessSpec {
  bool enabled = false;
  ProbeSpec probe{ProbeKind::kTcp, "127.0.0.1", 0, "", "/", "", StatusSet(), Millis(5000), Millis(1000)};
  int failures = 3;
};

struct RoleSpec {
  std::string name;
  SourcePos pos;                         // where the [[role]] begins
  SourcePos name_pos;                    // where its name is written
  std::vector<int> devices;              // GPU indices (-1 where a UUID is written); empty for a cpu role
  std::vector<std::string> device_uuids; // per device: "GPU-…" or "MIG-…" as written, "" for an index
  std::vector<SourcePos> device_pos;     // where each device index is written
  std::vector<int> nodes;                // node ranks this role runs on; empty: every node
  SourcePos nodes_pos;                   // where nodes is written
  int cpu = 0;                           // number of CPU-only processes
  std::vector<std::string> command;      // the payload, or empty for a builtin
  SourcePos command_pos;                 // where its command is written
  std::string builtin;                   // "target" | "drafter" | empty
  std::string spool;                     // "produce" | "consume" | empty: what the role does with the spool
  SourcePos spool_pos;                   // where spool is written (else builtin, else the role)
  std::vector<std::pair<std::string, std::string>> env;
  std::vector<SourcePos> env_pos;        // where each env value is written (parallel to env)
  /// Named TCP ports, one per process per name, reserved for the whole run
  /// (DFLASH_PORT_<NAME>, DFLASH_<ROLE>_<NAME>_PORTS; docs/config.md "Ports").
  std::vector<std::string> ports;
  std::vector<SourcePos> port_pos;       // where each name is written (parallel to ports)
  std::string cwd;
  std::vector<std::string> warmup;       // the seed's warm-up command; empty: command + DFLASH_WARMUP=1
  GateSpec gate;
  ReadySpec ready;
  RestartSpec restart;
  StopSpec stop;
  TorchWorld world = TorchWorld::kNone;
  SourcePos world_pos;        // where world is written (line 0: not written)
  /// A RUNNING process silent this long is hung (0: no watchdog): silent means no
  /// WATCHDOG=1 once it has sent one, else no output and no STATUS=.
  Millis watchdog{0};
  int watchdog_signal = SIGABRT;  // sent to a hung process (faulthandler dumps its stacks)
  /// `after`: the roles whose processes must all be ready before this one's start (docs/stacks.md).
  std::vector<std::string> after;
  std::vector<SourcePos> after_pos;  // where each name is written (parallel to after)
  /// A service (a store, a server) starts before the other roles and stops after them; the run
  /// ends when the other roles are done, and a service ending before that is a failure.
  bool service = false;
  SourcePos service_pos;
  /// Resolved by validation (launcher/config/role_order.h): the indices of the roles it starts
  /// after (`after`, and every service for a role that is not one), and its start phase.
  std::vector<size_t> starts_after;
  int phase = 0;
  LivenessSpec liveness;

  /// Its processes publish hidden-state frames: spool = "produce", or a builtin target.
  bool ProducesFrames() const { return spool == "produce" || builtin == "target"; }

  bool is_cpu() const { return devices.empty(); }
  /// Device i as written: "3", "GPU-5d0f…" or "MIG-…".
  std::string DeviceName(size_t i) const {
    return i < device_uuids.size() && !device_uuids[i].empty() ? device_uuids[i] : std::to_string(devices[i]);
  }
  /// Processes of this role on each node it runs on.
  int process_count() const { return is_cpu() ? cpu : static_cast<int>(devices.size()); }
  /// The gate mode in force: kAuto resolved by the number of processes.
  GateMode gate_mode() const {
    if (gate.mode != GateMode::kAuto) return gate.mode;
    return process_count() > 1 ? GateMode::kWarmup : GateMode::kSerial;
  }
  bool warmup_gated() const { return gate.enabled && gate_mode() == GateMode::kWarmup; }
  GateHold gate_hold() const { return gate.hold; }
  /// Whether the role runs on node `rank` (of any number of nodes).
  bool RunsOnNode(int rank) const;
};

struct RunSpec {
  std::string name;
  std::string cache_dir;   // absolute; TORCHINDUCTOR_CACHE_DIR and the gate live here
  std::string log_dir;     // absolute
  std::string spool_dir;   // absolute; hidden-state frames between target and drafters
  std::string checkpoint_dir;  // absolute, or "" for the default <run_dir>/checkpoints (a role's: /<role>)
  bool spool_dir_given = false;  // written in the file (else the default, /dev/shm/dflash-<uid>-<name>)
  /// Why the default spool dir was not taken (another user made it first) and which one is used: a warning.
  std::string spool_dir_note;
  SourcePos spool_dir_pos;        // the value, or [run] when not written
  int64_t spool_max_bytes = 0;    // 0: not written (producers take half the spool filesystem's free space)
  SourcePos spool_max_bytes_pos;  // the value, or [run] when not written
  /// The group that may read the run's logs ("": nobody else; dirs 0700, files 0600).
  std::string log_group;
  gid_t log_gid = static_cast<gid_t>(-1);  // log_group's id, once validated
  std::string master_addr;
  bool master_addr_given = false;  // written in the file (else the default or the scheduler's)
  int master_port = 0;             // 0: "auto" (a free port per run, see port_reservation.h)
  SourcePos master_port_pos;
  int nnodes = 0;                  // 0: not written (flags, the scheduler's env, else 1)
  std::vector<int> forward_signals;
  std::vector<int> stop_signals;   // stop the run as SIGTERM does (a preemption notice)
  bool share_gpus = false;  // several processes may use one GPU (docs/config.md)
  bool console_dedup = true; // a line several processes of a role say, printed once (docs/logs.md)
  /// Where the live run serves Prometheus metrics ("IP:PORT", launcher/config/metrics_address.h); "": off.
  std::string metrics = "127.0.0.1:0";
  SourcePos metrics_pos;  // where run.toml sets metrics (line 0: not set, the default): a build without them says so
  /// The coordination store of a multi-node run (docs/multinode.md): "" none (static
  /// mode), "private" (node 0 starts a redis-server for the run), or redis://host:port[/db].
  std::string store;
  SourcePos store_pos;
  Millis store_ttl{5000};                 // a node's registration lives this long unrefreshed
  Millis store_barrier_timeout{300000};   // the longest wait for every node at the start barrier
  Millis store_outage{30000};             // the store may be away this long before the node stops
  /// The store's password (docs/multinode.md, "Who can use the store"): read at run time from a file
  /// (absolute; 0600, ours) or an environment variable, never from the config or argv; at most one.
  /// A private store of several nodes needs it (every node's launcher must know it); one node alone
  /// draws a random one. It also keys the HMAC of the cluster gate's archives.
  std::string store_password_file;
  std::string store_password_env;
  std::string store_user;  // ACL user (AUTH user password); empty: the default user
};

struct RunConfig {
  std::string path;  // the config file as given
  RunSpec run;
  ModelSpec model;
  std::vector<RoleSpec> roles;

  /// Processes of one node (nnodes = 1: of the run).
  int world_size() const;
  const RoleSpec* FindRole(const std::string& name) const;
};

/// Reads and validates a config file. On any error fills `errors` (every error
/// found, not just the first) and returns false: nothing may be spawned then.
bool LoadConfig(const std::string& path, RunConfig* out, std::vector<ConfigError>* errors);

/// The same from text; `path` names it in messages and anchors relative paths.
bool LoadConfigFromString(std::string_view text, const std::string& path, RunConfig* out,
                          std::vector<ConfigError>* errors);

/// What is allowed but probably wrong (e.g. restart scope "process" for the
/// ranks of one torch world): each with where, the key and a hint. `check` and
/// `run` print them; neither refuses.
std::vector<ConfigError> ConfigWarnings(const RunConfig& config);

/// Evenly spread taps as DFlash picks them (z-lab/dflash model/utils.py):
/// from layer 1 to L-3; 64 layers, 5 draft layers -> 1,16,31,46,61.
std::vector<int> DefaultTappedLayers(int target_layers, int draft_layers);

}  // namespace dflash
