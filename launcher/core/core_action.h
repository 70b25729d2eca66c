// What the supervisor's core asks its shell to do (launcher/supervise/supervisor_actions.cc carries it out), in the
// order it was decided: the units, the start order, the incident and the rounds all speak through these.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

#include "contract/probe_spec.h"

namespace dflash {

/// What the shell must do, in order.
struct CoreAction {
  enum class Kind {
    kSpawn,          ///< start proc `index` (attempt already counted); answer OnSpawned/OnSpawnFailed
    kSignal,         ///< `signal` to its process group (and its payload's, under a worker, if `payload`)
    kKill,           ///< SIGKILL its process group and its payload's
    kEnded,          ///< it was reaped: kill what it left behind (cgroup leaf, groups, orphans)
    kKillAll,        ///< SIGKILL everything of the run now (second Ctrl-C, epoll failure)
    kTellSystemd,    ///< `text` to the supervisor's own NOTIFY_SOCKET
    kLog,            ///< `text` for supervisor.log and the console (`warn`: a warning)
    kEvent,          ///< one line of events.jsonl (`event`, without its wall time)
    kCheckReuse,     ///< proc `index` reused a gate and is ready: did it hit the cache?
    kRoundRequest,   ///< nodes: ask every node for the round after round `index` (`text`: why)
    kRoundStopped,   ///< nodes: every process here has stopped for round `index`
    kProbe,          ///< one try of `probe` for proc `index`; answer OnProbeResult with `seq`
    kSettleExec,     ///< a stop of proc `index` waits for its exec outcome: read it now, answer OnExecResult
    kStatusText,     ///< proc `index` said STATUS=`text`: its log line and the console's status (shown once)
  };
  Kind kind = Kind::kLog;
  size_t index = 0;
  int signal = 0;
  bool payload = false;
  bool warn = false;
  std::string text;
  nlohmann::json event;
  const ProbeSpec* probe = nullptr;  ///< kProbe: what to try (the plan's, lives as long as the run)
  uint64_t seq = 0;                  ///< kProbe: handed back with the answer

  static CoreAction Log(std::string text, bool warn = false) {
    CoreAction a;
    a.text = std::move(text);
    a.warn = warn;
    return a;
  }
  static CoreAction For(Kind kind, size_t index) {
    CoreAction a;
    a.kind = kind;
    a.index = index;
    return a;
  }
};

}  // namespace dflash
