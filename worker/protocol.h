// The two wire contracts between the supervisor and dflash-worker, defined once:
// the worker's command line (built by the launcher, read by the worker) and the
// notify fields (sent by the worker and by payloads on NOTIFY_SOCKET, read by the
// worker and the supervisor). Both sides call the Encode and Decode below; a
// field or a flag added here reaches both, and protocol_test.cc proves they agree.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "common/duration.h"
#include "contract/defaults.h"
#include "contract/gate_facts.h"
#include "contract/ready_spec.h"

namespace dflash {

// ---------------------------------------------------------------- worker argv

/// Everything `dflash-worker [OPTIONS] -- COMMAND...` is told on its command line.
/// The defaults are the worker's defaults: a field left at its default is not
/// written by EncodeWorkerArgv, and DecodeWorkerArgv restores it.
struct WorkerArgs {
  std::string name;  ///< "drafter:1"; empty: $DFLASH_PROCESS or the command
  ReadySpec ready;   ///< mode, argument, timeout (0: forever), stream (log mode)
  Millis stop_grace{std::chrono::seconds(10)};

  /// The compile gate; an empty dir runs the payload ungated.
  std::string gate_dir;
  std::string gate_key;
  Millis gate_timeout = kDefaultGateTimeout;
  Millis progress_every{std::chrono::seconds(5)};
  Millis gate_idle_hint = kDefaultGateIdleHint;
  bool warmup = false;
  bool publish_unchanged = false;
  // What the plan knows of the gate and the worker alone uses: every gate input comes by these flags, none by
  // the environment (the payload's environment is the payload's).
  std::string torch_version;  ///< recorded in READY
  /// The derived key's files, one "<sha256 or -> <path>" per line: into READY, and a later leader names the one
  /// whose edit changed the key.
  std::string gate_sources;
  std::string gpu_identity;  ///< recorded in READY and shipped archives, checked on fetch
  int leader_compile_threads = 0;  ///< TORCHINDUCTOR_COMPILE_THREADS for the payload once it leads; 0: unchanged
  bool verbose = false;

  std::vector<std::string> command;  ///< the payload, after "--"

  bool operator==(const WorkerArgs&) const;
};

/// `worker_bin` followed by the flags that differ from the defaults, "--" and
/// the command, in a fixed order (so plans print the same every time). What
/// has no meaning is not written: no readiness timeout for ready = none, no
/// stream outside log mode.
std::vector<std::string> EncodeWorkerArgv(const std::string& worker_bin, const WorkerArgs& args);

/// What DecodeWorkerArgv made of a command line.
enum class ArgvDecode {
  kRun,    ///< `out` is complete: run it
  kExit,   ///< --help or --version was printed: exit 0
  kUsage,  ///< bad command line; `err` says why: exit 64
};

/// Reads argv (argv[0] is the program) into `out`. The same flag table that
/// EncodeWorkerArgv writes from; --help/--version print to stdout.
ArgvDecode DecodeWorkerArgv(const std::vector<std::string>& argv, WorkerArgs* out, std::string* err);

// ------------------------------------------------------------- notify fields

/// One notify datagram, decoded: the systemd fields the project speaks
/// (READY, STATUS, MAINPID, WATCHDOG, STOPPING) and the worker's own
/// X_DFLASH_* facts. An unset optional means the datagram did not carry it.
struct NotifyFields {
  bool ready = false;     ///< READY=1
  bool stopping = false;  ///< STOPPING=1
  bool watchdog = false;  ///< WATCHDOG=1: "still alive" (the watchdog keep-alive)
  std::optional<std::string> status;  ///< STATUS=: a line for people
  std::optional<pid_t> main_pid;      ///< MAINPID=: the payload under a worker

  std::optional<std::string> error;         ///< X_DFLASH_ERROR=: why the worker failed
  std::optional<std::string> payload_exit;  ///< X_DFLASH_EXIT=: "killed by SIGSEGV (core dumped)"
  std::optional<int> payload_signal;        ///< X_DFLASH_SIGNAL=: the signal that killed the payload
  std::optional<double> ready_s;            ///< X_DFLASH_READY_S=: spawn to ready, seconds

  std::optional<std::string> gate_key;        ///< X_DFLASH_GATE_KEY=
  std::optional<GateRole> gate_role;          ///< X_DFLASH_GATE_ROLE=: "lead" or "reuse"
  std::optional<GateState> gate_state;        ///< X_DFLASH_GATE_STATE=
  std::optional<double> gate_wait_s;          ///< X_DFLASH_GATE_WAIT_S=: time spent waiting for the gate
  std::optional<double> gate_compile_s;       ///< X_DFLASH_GATE_COMPILE_S=: the leader's spawn to READY
  std::optional<std::string> gate_warning;    ///< X_DFLASH_GATE_WARNING=: say it loudly
  /// The cluster-wide gate (a local leader with DFLASH_STORE): "leader", "fetched" or "local-fallback".
  std::optional<ClusterOutcome> gate_cluster;     ///< X_DFLASH_GATE_CLUSTER=
  std::optional<int64_t> gate_cluster_token;      ///< X_DFLASH_GATE_CLUSTER_TOKEN=: the leader's fencing token
  std::optional<int64_t> gate_fetch_bytes;        ///< X_DFLASH_GATE_FETCH_BYTES=: the archive fetched
  std::optional<double> gate_fetch_s;             ///< X_DFLASH_GATE_FETCH_S=: fetch + check + import
  std::optional<int64_t> gate_published_bytes;    ///< X_DFLASH_GATE_PUBLISHED_BYTES=: the archive the leader shipped
  /// What a payload's own torch runs with, as dflash_launch.notify reports it (worker/compile_env_check.h).
  std::optional<std::string> payload_precompile;     ///< X_DFLASH_PRECOMPILE=: torch._dynamo.config.caching_precompile, "1"/"0"
  std::optional<std::string> payload_cache_key_tag;  ///< X_DFLASH_CACHE_KEY_TAG=: torch.compiler.config.cache_key_tag
  std::optional<std::string> payload_cpu_capability;  ///< X_DFLASH_CPU_CAPABILITY=: its os.environ's ATEN_CPU_CAPABILITY ("-": unset)

  /// Lines Decode did not take: an unknown key ("BARRIER=1", a newer
  /// worker's field), or a known key with a garbled value ("MAINPID=abc",
  /// "X_DFLASH_GATE_ROLE=leader": an enum's value outside its table).
  /// Diagnostics only: one bad line never spoils the others.
  std::vector<std::string> ignored;

  bool operator==(const NotifyFields&) const;
};

/// The datagram text, one KEY=VALUE per line, READY=1 last (a receiver that
/// acts on READY sees the facts sent with it). Values must not hold '\n':
/// one is replaced by a space, so a message cannot forge a field.
std::string EncodeNotify(const NotifyFields& fields);

/// The fields of one datagram, as NotifyMessage::fields holds them. When a key
/// repeats, the last value wins (as NotifyMessage::Get does).
NotifyFields DecodeNotify(const std::vector<std::pair<std::string, std::string>>& lines);
/// The same from the raw datagram text.
NotifyFields DecodeNotify(std::string_view text);

}  // namespace dflash
