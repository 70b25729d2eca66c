#include "launcher/config/schema.h"

#include <algorithm>
#include <cstdlib>
#include <numeric>

#include "common/duration.h"
#include "contract/defaults.h"
#include "launcher/config/config.h"  // the enums' name tables

namespace dflash {
namespace {

std::vector<SectionSpec> MakeSchema() {
  using K = KeyType;
  // Defaults are written where they live -- the config structs (enums, by their name tables) and
  // contract/defaults.h (shared with the worker and the gate CLI) -- and spelled here for run.toml and
  // docs/config.md. Static: KeySpec holds views.
  static const std::string gate_timeout = FormatDuration(kDefaultGateTimeout);
  static const std::string gate_idle_hint = FormatDuration(kDefaultGateIdleHint);
  return {
      {"run", "How the run is laid out on each host (see docs/multinode.md for more than one node).",
       {
           {"name", K::kString, "<config file name>",
            "Run name: prefixes run ids and names the default spool and cache.", "\"qwen36-27b-dflash\""},
           {"cache_dir", K::kPath, "~/.cache/dflash/<name>",
            "Compile cache root: TORCHINDUCTOR_CACHE_DIR (and TRITON_CACHE_DIR=<cache_dir>/triton); the gate "
            "lives in <cache_dir>/.dflash. Must be yours and not group/other-writable: Inductor loads pickles "
            "and .so files from it.",
            "\"/var/cache/dflash\""},
           {"log_dir", K::kPath, "runs",
            "Logs and summaries go to <log_dir>/<run_id>/ (0700, files 0600). Relative paths are relative to "
            "the config file. It may be a shared sticky directory (like /tmp); the way there must be only yours "
            "or root's to change.",
            "\"runs\""},
           {"log_group", K::kString, "<none>",
            "A group that may read the run's logs: the run dir and attempt dirs become 0750 and their files "
            "0640, owned by this group (you must be in it). Unset: nobody else can read them.",
            "\"ml-team\""},
           {"spool_dir", K::kPath, "/dev/shm/dflash-<uid>-<name>",
            "Hidden-state frames from target to drafters (builtin roles). If another user made the default first, "
            "an unguessable <default>-<random> is used instead, with a warning.",
            "\"/dev/shm/dflash-spool\""},
           {"checkpoint_dir", K::kPath, "<run_dir>/checkpoints",
            "Checkpoints of the training processes (dflash_launch.Checkpoint, docs/checkpoints.md): each role's in "
            "<checkpoint_dir>/<role> (DFLASH_CHECKPOINT_DIR). A restarted process resumes from its role's last "
            "one, and so does a run continued with --resume; another run's is refused (exit 78) unless the role's "
            "env has DFLASH_CHECKPOINT_ADOPT=1. Past one node it must be storage every node shares.",
            "\"/shared/ckpt/qwen36-27b-dflash\""},
           {"spool_max_bytes", K::kInt, "<half the spool filesystem's free space>",
            "The spool's byte budget: a producer waits while the frames ready, claimed and being written on its "
            "node would pass it (DFLASH_SPOOL_MAX_BYTES; the builtin target and dflash_launch.spool.producer "
            "honour it). `check` warns when it, or the spool filesystem's free space, cannot hold one frame of "
            "[model]: batch x seq_len x taps x hidden x dtype bytes, the tokens (batch x seq_len x 8) and a header.",
            "8_000_000_000"},
           {"master_addr", K::kString, "127.0.0.1",
            "MASTER_ADDR for torch.distributed: the host of rank 0 (node 0). `--master-addr` and the "
            "scheduler's (Slurm, Kubernetes) come first when this key is not written.",
            "\"127.0.0.1\""},
           {"master_port", K::kPort, "auto",
            "MASTER_PORT. \"auto\": one node: a free port per run, held for the run by a per-host lock so two "
            "runs never meet; several nodes: derived from the run id (all nodes agree). A number: that port, "
            "and each role gets ROLE_MASTER_PORT = master_port + 1 + role index; a port in use on this host "
            "is an error before anything starts (exit 69).",
            "29500"},
           {"nnodes", K::kInt, "1",
            "Nodes of the run, one dflash-launch each (docs/multinode.md). Usually left to `--nnodes` or "
            "the scheduler (SLURM_NNODES, NNODES); if written, they must agree.",
            "2"},
           {"store", K::kString, "<none>",
            "The coordination store of a multi-node run (docs/multinode.md): node launchers register, meet "
            "at a start barrier, publish failures and restart rounds there. \"private\": node 0's launcher "
            "starts a redis-server for the run on MASTER_ADDR (port master_port + 1 + 2 x roles; one node: a "
            "free port); or \"redis://HOST[:PORT][/DB]\". Unset: static mode. `--store` comes first.",
            "\"redis://10.0.0.5:6379\""},
           {"store_ttl", K::kDuration, "5s",
            "With a store: a node's registration expires this long after its last refresh (every ttl/3); a "
            "launcher that dies is noticed by the others within store_ttl + store_ttl/3.",
            "\"5s\""},
           {"store_barrier_timeout", K::kDuration, "5m",
            "With a store: the longest wait for every node at the start barrier (then exit 75 naming the "
            "missing nodes) and at a restart round's; also how long node 0 keeps a private store up for nodes "
            "still running after it ended.",
            "\"5m\""},
           {"store_outage", K::kDuration, "30s",
            "With a store: how long it may be unreachable (at start, or mid-run: the processes go on) before "
            "the node stops with the reason.",
            "\"30s\""},
           {"store_password_file", K::kString, "<none>",
            "With a store: a file (chmod 600, yours) whose one line is the store's password: sent as AUTH by "
            "every launcher and process, and the key of the HMAC that signs the cluster gate's archives. "
            "Never printed. A private store of several nodes needs it (or store_password_env); one node "
            "alone draws a random one.",
            "\"~/.config/dflash/store.secret\""},
           {"store_password_env", K::kString, "<none>",
            "With a store: the environment variable that holds the store's password (e.g. set by the "
            "scheduler), instead of store_password_file. Its name, not its value, goes here.",
            "\"DFLASH_STORE_PASSWORD\""},
           {"store_user", K::kString, "<none>",
            "With a redis:// store: the Redis ACL user to AUTH as (with the password). Unset: the default user.",
            "\"dflash\""},
           {"forward_signals", K::kSignalArray, "[]",
            "Signals the supervisor passes through to every process (e.g. preemption notices).",
            "[\"SIGUSR1\"]"},
           {"stop_signals", K::kSignalArray, "[]",
            "Signals that stop the run as SIGTERM does: each process gets its role's stop.signal and stop.grace "
            "to checkpoint (a scheduler's preemption notice, e.g. Slurm's --signal=USR1@120).",
            "[\"SIGUSR1\"]"},
           {"share_gpus", K::kBool, "false",
            "Allow several processes on one GPU (a GPU listed twice in devices, or by two roles): small "
            "drafters, tests, a one-GPU check. Off, a shared GPU is a config error. Each process still sees "
            "its GPU as cuda:0. Two ranks of one torch world (world = \"role\"/\"run\") on one GPU stay an "
            "error: NCCL refuses them.",
            "true"},
           {"console_dedup", K::kBool, "true",
            "A line that several processes of one role print within 1 s is shown once on the console, with "
            "the ranks that said it (\"[drafter:0-2] UserWarning: ...\"; numbers masked for matching, as Ray "
            "does). Their lines reach the console up to 1 s late; the log files keep every byte. "
            "`run --no-dedup` turns it off for one run.",
            "false"},
           {"metrics", K::kAddress, "127.0.0.1:0",
            "Where the live run serves its Prometheus metrics (GET /metrics, docs/metrics.md): \"IP:PORT\" "
            "(IPv6 in brackets); port 0 takes a free one. The URL is in `ctl status --json` and "
            "<run_dir>/metrics.url; `ctl metrics` prints the same text. Loopback by default: a Prometheus on "
            "another host needs the node's address (e.g. \"0.0.0.0:9400\"). false: not served.",
            "\"0.0.0.0:9400\""},
       }},
      {"model", "The shape contract, checked before anything starts. The drafter input is "
                "[batch, seq_len, len(tapped_layers) * hidden]: taps concatenated on the feature axis.",
       {
           {"target_layers", K::kInt, "", "Layers of the frozen target model.", "64", {}, true},
           {"hidden", K::kInt, "", "Hidden size of the target model.", "5120", {}, true},
           {"tapped_layers", K::kIntArray, "<spread over 1..target_layers-3>",
            "Target layer ids whose outputs feed the drafter, strictly ascending, each < target_layers. "
            "Layer id i is HF hidden_states[i+1]. Default: draft_layers ids spread evenly from 1 to "
            "target_layers-3, as DFlash picks them.",
            "[1, 16, 31, 46, 61]"},
           {"draft_layers", K::kInt, "5", "Layers of the drafter.", "5"},
           {"block_size", K::kInt, "16", "Tokens predicted in parallel per block (anchor + block_size-1).",
            "16"},
           {"seq_len", K::kInt, "", "Sequence length of a training sample.", "2000", {}, true},
           {"batch", K::kInt, "1", "Samples per step.", "1"},
           {"dtype", K::kEnum, "bf16", "Hidden-state dtype.", "\"bf16\"", {"bf16", "fp16", "fp32"}},
           {"heads", K::kInt, "<not checked>", "Drafter attention heads; hidden must divide by it.", "32"},
           {"kv_heads", K::kInt, "<heads>", "Drafter key/value heads; heads must divide by it.", "8"},
           {"vocab", K::kInt, "32000", "Vocabulary size (the builtin roles' embedding and head).", "151936"},
           {"seed", K::kInt, "0", "Seed of the builtin target's weights and synthetic tokens.", "0"},
           {"input_shape", K::kIntArray, "<derived>",
            "Optional: the drafter input shape you expect. Checked against the derived "
            "[batch, seq_len, n_taps*hidden].",
            "[1, 2000, 25600]"},
           {"input_layout", K::kEnum, "concat",
            "How taps are combined: only \"concat\" (feature axis) is valid; \"stacked\" [B,S,n,H] is the "
            "classic mistake and is rejected with the reshape that fixes it.",
            "\"concat\"", {"concat", "stacked"}},
           {"fc_in", K::kInt, "<n_taps*hidden>",
            "Optional: the in-features of the drafter's fc layer; must be n_taps*hidden.", "25600"},
       }},
      {"role", "One [[role]] table per group of identical processes; one process per device.",
       {
           {"name", K::kString, "", "Role name ([a-z][a-z0-9_-]*), unique. Processes are <name>:<rank>.",
            "\"drafter\"", {}, true},
           {"devices", K::kIntArray, "",
            "GPUs, one process each (CUDA_VISIBLE_DEVICES=<it>, so each sees cuda:0): indices as nvidia-smi "
            "numbers them (CUDA_DEVICE_ORDER=PCI_BUS_ID unless set), or UUIDs (\"GPU-...\", \"MIG-...\"). Under an "
            "inherited CUDA_VISIBLE_DEVICES (Slurm gres, a container) indices count into that list. A GPU may "
            "belong to one process only, unless [run] share_gpus = true. Exactly one of devices and cpu.",
            "[5, 6, 7]"},
           {"cpu", K::kInt, "", "Number of CPU-only processes (CUDA_VISIBLE_DEVICES=\"\").", "3"},
           {"nodes", K::kIntArray, "<every node>",
            "Node ranks the role runs on; on each of them it runs `devices` (or `cpu`) processes. Ranks are "
            "global: node by node, then role by role.",
            "[1]"},
           {"command", K::kStringArray, "",
            "The payload's argv, run through PATH. Exactly one of command and builtin.",
            "[\"python\", \"train.py\", \"--role\", \"drafter\"]"},
           {"builtin", K::kEnum, "", "A builtin LibTorch role instead of a command.", "\"target\"",
            {"target", "drafter"}},
           {"spool", K::kEnum, "<none; a builtin target: produce>",
            "What the role does with the hidden-state spool. \"produce\": each process publishes frames "
            "(dflash_launch.spool.SpoolProducer) and counts in DFLASH_SPOOL_PRODUCERS, so the drafters' "
            "sources end when every producer finished. \"consume\": it reads them (dflash_launch.spool.world."
            "WorldSource for a DDP world), and some role must produce on each node it runs on (checked).",
            "\"produce\"", {"produce", "consume"}},
           {"env", K::kEnvTable, "{}",
            "Extra environment for this role's processes. Variables that dflash-launch or dflash-worker set (RANK, "
            "CUDA_VISIBLE_DEVICES, DFLASH_STORE, ...: contract/env_vars.h) cannot be set here; the defaults "
            "OMP_NUM_THREADS, PYTHONUNBUFFERED and PYTHONFAULTHANDLER can. The processes get every value as it is; "
            "`check` shows a secret-looking one (HF_TOKEN, *_API_KEY, a URL's password) redacted.",
            "{ OMP_NUM_THREADS = \"4\" }"},
           {"ports", K::kStringArray, "[]",
            "Named TCP ports ([a-z][a-z0-9_]*): per name, one free port per process of the role, reserved for "
            "the whole run as an auto master_port is (no two runs on this host get the same one; a restarted "
            "process keeps its own). The process gets it as DFLASH_PORT_<NAME>, every process of the run gets "
            "the role's as DFLASH_<ROLE>_<NAME>_PORTS=p0,p1,... in role-rank order (role name upper-cased, '-' "
            "-> '_'; with several nodes: this node's processes only). Nothing binds it for the process.",
            "[\"http\"]"},
           {"cwd", K::kPath, "<the launcher's cwd>", "Working directory of the processes.", "\".\""},
           {"warmup", K::kStringArray, "<command with DFLASH_WARMUP=1>",
            "What `dflash-launch seed` runs to pre-compile this role.", "[\"python\", \"warmup.py\"]"},
           {"gate", K::kGate, "false",
            "The compile gate: true, or a table (see role.gate). One process per key compiles, the others "
            "wait, then reuse the cached kernels.",
            "{ key = \"drafter\", timeout = \"20m\" }"},
           {"ready", K::kReady, "\"none\" (\"notify\" when gated)",
            "When a process counts as ready: a mode string, or a table (see role.ready).", "\"notify\""},
           {"restart", K::kRestart, "{ policy = \"never\" }", "Restart on failure (see role.restart).",
            "{ policy = \"on-failure\", scope = \"process\", max = 3 }"},
           {"stop", K::kStop, "{ signal = \"SIGTERM\", grace = \"30s\" }", "How the role is stopped.",
            "{ signal = \"SIGINT\", grace = \"60s\" }"},
           {"world", K::kEnum, NameIn(kTorchWorldNames, RoleSpec{}.world),
            "The torch.distributed world its processes join (the launcher cannot see inside the payload, so "
            "say it): role, the role's own world (ROLE_MASTER_PORT, dflash_launch.init_process_group() by "
            "default); run, the run-wide world (MASTER_PORT) shared by every role with world = \"run\"; none, "
            "independent processes. The processes of one world are one restart unit whatever restart.scope says "
            "(a lone rank restarted into a live world cannot rejoin it), and so are they for `ctl restart`.",
            "\"role\"", NamesIn(kTorchWorldNames)},
           {"watchdog", K::kDuration, "0s",
            "A RUNNING process silent this long is hung: it gets watchdog_signal, then SIGKILL after the stop "
            "grace, and counts as a failure (reason \"hung\") judged by restart. Silent: no WATCHDOG=1 "
            "(dflash_launch.notify_watchdog()) once it has sent one; a process that never sends one is watched "
            "by its progress instead (any output line or STATUS=). \"0s\": no watchdog.",
            "\"5m\""},
           {"after", K::kStringArray, "[]",
            "Roles this one starts after: its processes start (and restart) only once every process of those "
            "roles here is ready (RUNNING, or exited 0). On a stop the order is reversed: it stops before "
            "them, each with its grace. A cycle or an unknown role is a config error; `check` prints the "
            "start order (docs/stacks.md).",
            "[\"target\"]"},
           {"service", K::kBool, "false",
            "A service (a store, a server the roles talk to): it starts before every role that is not a "
            "service and stops after them. Its exit, even with code 0, is a failure judged by restart while "
            "the run goes on; the run ends when the roles that are not services are done, then the services "
            "are stopped (docs/stacks.md).",
            "true"},
           {"watchdog_signal", K::kSignal, "SIGABRT",
            "Sent to a hung process (to its payload, under dflash-worker). SIGABRT makes Python's faulthandler "
            "(PYTHONFAULTHANDLER=1 is set for watched processes) print every thread's stack to stderr.",
            "\"SIGUSR1\""},
           {"liveness", K::kLiveness, "<none>",
            "A network probe of a RUNNING server (see role.liveness): `failures` failed tries in a row and it is "
            "hung, handled as the watchdog's hung verdict (watchdog_signal, SIGKILL after the stop grace, a "
            "failure judged by restart).",
            "{ mode = \"http\", url = \"http://127.0.0.1:8080/health\", interval = \"2s\", failures = 3 }"},
       }},
      {"role.gate", "The compile gate of a role (`gate = true` takes every default).",
       {
           {"key", K::kString, "<role>-<hash>",
            "Gate key ([A-Za-z0-9._-], at most 128). Default: the role name and a hash of the [model] "
            "contract, torch's version, the command, the content of its script and of the modules that imports (and "
            "key_files), and every TORCHINDUCTOR_*/TORCH_COMPILE_*/"
            "TORCHDYNAMO_*/TRITON_* variable, so a change of any of them never reuses a stale READY.",
            "\"drafter\""},
           {"mode", K::kEnum, NameIn(kGateModeNames, GateSpec{}.mode),
            "warmup: before the role starts, one warm-up process (the `warmup` command, or the command with "
            "DFLASH_WARMUP=1, in a world of one) compiles under the gate and publishes READY; then every process "
            "of the role starts together on the warm cache -- the mode for processes that form a process group "
            "(DDP/FSDP), which cannot be held back one by one. serial: each process takes the gate as it starts; "
            "the first compiles and keeps running, the others wait -- for independent processes only. auto: "
            "serial for a role of one process, warmup otherwise.",
            "\"warmup\"", NamesIn(kGateModeNames)},
           {"hold", K::kEnum, NameIn(kGateHoldNames, GateSpec{}.hold),
            "Mode warmup: which processes wait for the warm-up. all: every one. one: only the role's first "
            "process on each node; the others start with the warm-up (their Python, torch and model load overlap "
            "its compile) and wait inside init_process_group's rendezvous, which cannot complete without the held "
            "one; they compile after it, on the warm cache. For a torch world whose script joins the world before "
            "it compiles (DDP and FSDP do: they wrap the model in the group); a process that compiles before it "
            "joins would compile beside the warm-up. Measured on 2 cores, one was slower than all (docs/benchmarks.md): "
            "it pays where cores are plenty and start-up is long.",
            "\"one\"", NamesIn(kGateHoldNames)},
           {"key_files", K::kStringArray, "[]",
            "Extra files whose content goes into the derived key (glob(7) patterns, relative to the role's cwd), "
            "beside the script the command runs and the Python modules it imports from outside the interpreter's "
            "install, which are always in it: for what an import cannot show (importlib, exec, a file the model "
            "reads).",
            "[\"model/*.py\", \"conf.yaml\"]"},
           {"timeout", K::kDuration, gate_timeout, "How long a process waits for the gate before it fails.",
            "\"20m\""},
           {"idle_hint", K::kDuration, gate_idle_hint,
            "A waiter whose leader's processes used almost no CPU for this long says so, with the likely cause "
            "(a leader blocked on its peers) and the fix; \"0s\" turns the hint off.",
            "\"2m\""},
           {"precompile", K::kBool, "false",
            "Removed: only false is accepted. Dynamo's precompile cache computed wrong values (torch drops "
            "identity guards in the live process); every process traces for itself and loads the shared, "
            "content-addressed caches (docs/cachelock.md, \"What is exact\").",
            "false"},
           {"enabled", K::kBool, "true", "Set false to keep the table but run ungated.", "true"},
       }},
      {"role.ready", "Readiness (`ready = \"notify\"` is short for `ready = { mode = \"notify\" }`).",
       {
           {"mode", K::kEnum, NameIn(kReadyModeNames, ReadySpec{}.mode),
            "none: ready at start; notify: READY=1 on NOTIFY_SOCKET (systemd protocol); log: a line of "
            "output matches `pattern`; file: `path` exists; exit: the process exited 0; tcp: a TCP connect to "
            "`port` succeeds; http: a GET of `url` answers with a status in `status`.",
            "\"notify\"", NamesIn(kReadyModeNames)},
           {"pattern", K::kString, "", "mode = \"log\": POSIX extended regex matched against each line.",
            "\"compiled in [0-9.]+s\""},
           {"stream", K::kEnum, NameIn(kReadyStreamNames, ReadySpec{}.stream),
            "mode = \"log\": which output is matched. stdout by default, so a traceback on stderr that echoes "
            "the source line holding the pattern never counts as ready.",
            "\"both\"", NamesIn(kReadyStreamNames)},
           {"path", K::kPath, "", "mode = \"file\": the file whose appearance means ready.",
            "\"/tmp/ready\""},
           {"port", K::kInt, "",
            "mode = \"tcp\": the port (1-65535) a TCP connect must reach, or the name of one of the role's ports "
            "(port = \"http\": each process its own); ready once one succeeds.", "8080"},
           {"host", K::kString, "127.0.0.1",
            "mode = \"tcp\": the address to connect to: an IP literal (no host names: DNS could stall the "
            "supervisor), or \"localhost\".",
            "\"::1\""},
           {"url", K::kString, "",
            "mode = \"http\": http://ADDR[:PORT][/PATH] (ADDR an IP literal, [v6] or localhost; port 80 if "
            "none; :{NAME} for a named port of the role, each process its own). Ready once a GET answers with a status "
            "in `status`. Only http://, not https.",
            "\"http://127.0.0.1:8080/health\""},
           {"status", K::kString, "2xx",
            "mode = \"http\": the statuses that count: classes and codes, comma-separated.", "\"200,204\""},
           {"interval", K::kDuration, "500ms",
            "mode = \"tcp\"/\"http\": the pause between the end of one try and the next.", "\"1s\""},
           {"probe_timeout", K::kDuration, "1s",
            "mode = \"tcp\"/\"http\": the most one try (connect, request, status line) may take.", "\"2s\""},
           {"timeout", K::kDuration, "30m", "Not ready by then: the process fails (exit 75).", "\"20m\""},
       }},
      {"role.liveness", "A network probe of a RUNNING server: the watchdog's evidence, for a server that "
                        "cannot send WATCHDOG=1. The probe starts once the process is ready.",
       {
           {"mode", K::kEnum, "", "tcp: a TCP connect succeeds; http: a GET answers with a status in `status`.",
            "\"http\"", {"tcp", "http"}, true},
           {"port", K::kInt, "", "mode = \"tcp\": the port, or the name of one of the role's ports.", "8080"},
           {"host", K::kString, "127.0.0.1", "mode = \"tcp\": the address (an IP literal or \"localhost\").",
            "\"127.0.0.1\""},
           {"url", K::kString, "", "mode = \"http\": the URL, as for ready.url.",
            "\"http://127.0.0.1:8080/health\""},
           {"status", K::kString, "2xx", "mode = \"http\": the statuses that count as alive.", "\"200\""},
           {"interval", K::kDuration, "5s", "The pause between tries.", "\"2s\""},
           {"probe_timeout", K::kDuration, "1s", "The most one try may take.", "\"2s\""},
           {"failures", K::kInt, "3", "Failed tries in a row that make it hung.", "3"},
       }},
      {"role.restart", "What happens when a process of the role fails.",
       {
           {"policy", K::kEnum, NameIn(kRestartPolicyNames, RestartSpec{}.policy),
            "never; on-failure (non-zero exit or signal); always (also after exit 0).", "\"on-failure\"",
            NamesIn(kRestartPolicyNames)},
           {"scope", K::kEnum, NameIn(kRestartScopeNames, RestartSpec{}.scope),
            "What restarts: the failed process; its whole role; or every process of the run.",
            "\"process\"", NamesIn(kRestartScopeNames)},
           {"max", K::kInt, "3", "Restarts allowed within `window`; one more failure is fatal.", "3"},
           {"window", K::kDuration, "30m", "The sliding window in which restarts are counted.", "\"30m\""},
           {"backoff", K::kBackoff, "1s..1m",
            "Delay before a restart, \"MIN..MAX\": doubles from MIN at each restart, capped at MAX.",
            "\"5s..2m\""},
           {"reset_after", K::kDuration, "10m",
            "A process that ran this long before failing starts again from the MIN backoff.", "\"10m\""},
           {"no_restart_exit_codes", K::kIntArray, "[]", "Exit codes that are never restarted.", "[2]"},
       }},
      {"role.stop", "How the role's processes are stopped.",
       {
           {"signal", K::kSignal, "SIGTERM", "Sent to each process group first.", "\"SIGINT\""},
           {"grace", K::kDuration, "30s", "Then SIGKILL if still running.", "\"60s\""},
       }},
  };
}

}  // namespace

const std::vector<SectionSpec>& Schema() {
  static const std::vector<SectionSpec> schema = MakeSchema();
  return schema;
}

const SectionSpec& Section(std::string_view name) {
  for (const SectionSpec& s : Schema())
    if (s.name == name) return s;
  std::abort();  // a programming error: every section read is declared above
}

const KeySpec* FindKey(std::string_view section, std::string_view key) {
  for (const KeySpec& k : Section(section).keys)
    if (k.name == key) return &k;
  return nullptr;
}

std::string DescribeType(const KeySpec& k) {
  switch (k.type) {
    case KeyType::kString: return "a string";
    case KeyType::kInt: return "an integer";
    case KeyType::kBool: return "true or false";
    case KeyType::kIntArray: return "an array of integers, like " + std::string(k.example);
    case KeyType::kStringArray: return "an array of strings, like " + std::string(k.example);
    case KeyType::kEnvTable: return "a table of strings, like " + std::string(k.example);
    case KeyType::kDuration: return "a duration string like \"30s\", \"20m\" or \"1h30m\"";
    case KeyType::kSignal: return "a signal name like \"SIGTERM\"";
    case KeyType::kSignalArray: return "an array of signal names like [\"SIGUSR1\"]";
    case KeyType::kPath: return "a path string";
    case KeyType::kEnum: {
      std::string s = "one of ";
      for (size_t i = 0; i < k.choices.size(); ++i)
        s += (i ? ", \"" : "\"") + std::string(k.choices[i]) + "\"";
      return s;
    }
    case KeyType::kPort: return "a port number (1-65535) or \"auto\"";
    case KeyType::kAddress: return "an address \"IP:PORT\" (port 0: a free one) or false";
    case KeyType::kBackoff: return "\"MIN..MAX\" durations like \"5s..2m\"";
    case KeyType::kGate: return "true, false, or a table like " + std::string(k.example);
    case KeyType::kReady: return "a mode string or a table like { mode = \"log\", pattern = \"...\" }";
    case KeyType::kRestart:
    case KeyType::kStop:
    case KeyType::kLiveness: return "a table like " + std::string(k.example);
  }
  return "?";
}

size_t EditDistance(std::string_view a, std::string_view b) {
  // Damerau-Levenshtein (optimal string alignment): a swap of two letters is one typo.
  std::vector<std::vector<size_t>> d(a.size() + 1, std::vector<size_t>(b.size() + 1));
  for (size_t i = 0; i <= a.size(); ++i) d[i][0] = i;
  for (size_t j = 0; j <= b.size(); ++j) d[0][j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    for (size_t j = 1; j <= b.size(); ++j) {
      size_t cost = a[i - 1] == b[j - 1] ? 0 : 1;
      d[i][j] = std::min({d[i - 1][j] + 1, d[i][j - 1] + 1, d[i - 1][j - 1] + cost});
      if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1])
        d[i][j] = std::min(d[i][j], d[i - 2][j - 2] + 1);
    }
  }
  return d[a.size()][b.size()];
}

std::string ClosestName(std::string_view typo, const std::vector<std::string_view>& names) {
  std::string best;
  size_t best_d = std::max<size_t>(2, typo.size() / 3) + 1;
  for (std::string_view n : names) {
    size_t d = EditDistance(typo, n);
    if (d < best_d) {
      best_d = d;
      best = n;
    }
  }
  return best;
}

std::string SchemaMarkdown() {
  std::string md;
  for (const SectionSpec& s : Schema()) {
    std::string title = s.name == "role" ? "[[role]]" : s.name.find('.') != std::string_view::npos
                                                            ? std::string(s.name)
                                                            : "[" + std::string(s.name) + "]";
    md += "### `" + title + "`\n\n" + std::string(s.doc) + "\n\n";
    md += "| key | type | default | meaning | example |\n|---|---|---|---|---|\n";
    for (const KeySpec& k : s.keys) {
      std::string def = k.required ? "**required**" : k.default_value.empty() ? "—"
                                                                               : "`" + std::string(k.default_value) + "`";
      std::string type = DescribeType(k);
      // Tables in a markdown cell: keep the pipes out.
      for (std::string* cell : {&type}) std::replace(cell->begin(), cell->end(), '|', '/');
      md += "| `" + std::string(k.name) + "` | " + type + " | " + def + " | " + std::string(k.doc) +
            " | `" + std::string(k.example) + "` |\n";
    }
    md += "\n";
  }
  return md;
}

}  // namespace dflash
