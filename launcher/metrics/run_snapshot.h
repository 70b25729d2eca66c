// What the supervisor knows of a live run at one moment, as plain values: the input of RunMetrics. The
// supervisor fills it on its loop thread from its core (states, attempts, gate facts) and the payloads'
// metrics files; RunMetrics adds what it reads itself (/proc of each process, the spool's directories).
#pragma once

#include <sys/types.h>

#include <nlohmann/json.hpp>

#include <map>
#include <optional>
#include <string>
#include <vector>

namespace dflash {

/// Why a process was restarted (dflash_restarts_total's `reason`): a short closed set, so a label never
/// carries free text. Every process starts with each at 0, so increase() sees the first restart.
inline constexpr const char* kRestartReasons[] = {
    "exit",          // its attempt exited non-zero (or a service exited at all)
    "signal",        // killed by a signal it did not get from the supervisor
    "hung",          // its watchdog or liveness probe judged it hung
    "not_ready",     // not ready within ready.timeout
    "start_failed",  // could not be started (fork, exec: 126/127)
    "unit",          // stopped and started again because another process of its restart unit failed
    "ctl",           // restarted by hand (`ctl restart`, or `ctl start` after a stop asked by hand)
};

struct ProcessSnapshot {
  std::string name;  ///< "drafter:1", "drafter:warmup"
  std::string role;
  std::string state;  ///< ProcStateName: RUNNING, BACKOFF, ...
  bool up = false;    ///< RUNNING
  pid_t pid = -1;     ///< the process to measure (its payload when known and still in its tree), -1: none
  int attempt = -1;   ///< spawns so far - 1
  double uptime_s = 0;  ///< this attempt, while it lives
  std::map<std::string, int> restarts;  ///< reason (kRestartReasons) -> restarts so far
  std::optional<int> last_exit_code;    ///< shell style (128+N) of its last ended attempt
  // The compile gate of its last attempt (contract/gate_facts.h).
  std::optional<double> gate_wait_s, compile_s;
  std::optional<std::string> gate_role;  ///< lead, reuse, none
  /// Its current attempt's DFLASH_METRICS_FILE (null: none yet): training steps, loss, the cache counters.
  nlohmann::json metrics;
};

struct RunSnapshot {
  std::string run_id;
  std::string node;  ///< node index ("0" alone)
  double uptime_s = 0;
  bool stopping = false;
  std::vector<ProcessSnapshot> processes;
  /// The run's spool (<spool_dir>/<run_id>); "" when no role produces frames.
  std::string spool_dir;
  /// Wall-clock now (seconds since the epoch), for the checkpoint's age.
  double unix_now = 0;
};

}  // namespace dflash
