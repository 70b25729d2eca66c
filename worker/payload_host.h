// Hosts one payload (the user's command of a role) until it exits: spawn,
// readiness, signal forwarding, reaping, exit status. `dflash-worker` and
// `dflash-cachelock run` glue the compile gate on through the callbacks.
#pragma once

#include <signal.h>
#include <sys/types.h>

#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "common/duration.h"
#include "common/spawn.h"
#include "contract/ready_spec.h"
#include "worker/protocol.h"

namespace dflash {

/// What to do when the payload is not ready in time.
enum class TimeoutAction {
  kStop,         ///< stop the payload's group and report kTimeout (75)
  kKeepRunning,  ///< stop waiting for readiness; the payload runs on
};

struct PayloadHostOptions {
  /// For messages: "drafter:1". Defaults to argv[0].
  std::string name;
  std::vector<std::string> argv;
  /// The payload's base environment; empty means this process's environment.
  std::vector<std::string> env;
  /// Set on top of `env` (e.g. DFLASH_GATE_ROLE). NOTIFY_SOCKET is always
  /// decided by the host: the listener's address in notify mode, unset
  /// otherwise (an inherited one would make the payload talk past us).
  std::vector<std::pair<std::string, std::string>> extra_env;
  std::string cwd;
  ReadySpec ready;

  /// Where the payload's output goes. Outside log mode these fds are given to
  /// the payload itself (zero copy); in log mode the host relays into them.
  int stdout_fd = 1;
  int stderr_fd = 2;

  /// How the host stops the payload's group (readiness timeout, leftovers
  /// after the payload exited): this signal, then SIGKILL after the grace.
  int stop_signal = SIGTERM;
  Millis stop_grace{10'000};

  /// Stop the payload's group (stop signal, grace, SIGKILL) once it is ready
  /// and on_ready has run; the host then returns 0: a warm-up's job is done
  /// when it has compiled.
  bool stop_when_ready = false;

  /// Called once, after exec succeeded and before readiness is awaited.
  std::function<void(pid_t pid)> on_spawned;
  /// Called exactly once when the payload is ready, synchronously: nothing
  /// else (no signal forwarding, no exit handling) happens until it returns.
  /// Never for evidence (a READY=1, a matching line) that only a payload
  /// which then failed left behind: that one is judged by its exit status.
  std::function<void()> on_ready;
  /// Every datagram the payload (or its process group) sends, before anything in it is acted on (its READY too).
  std::function<void(const NotifyFields& fields)> on_notify;
  /// Each STATUS= line the payload (or its process group) sends in notify mode.
  std::function<void(std::string_view status)> on_status;
  /// Each WATCHDOG=1 the payload sends (relayed to the supervisor's watchdog).
  /// Set: the payload gets a NOTIFY_SOCKET whatever the readiness mode.
  std::function<void()> on_watchdog;
  /// Called when the readiness timeout expires, with the message that will be
  /// reported. Unset means TimeoutAction::kStop.
  std::function<TimeoutAction(const std::string& message)> on_ready_timeout;
};

struct PayloadResult {
  /// The code to exit with: the payload's exit code, 128+N if it was killed
  /// by signal N, 127/126 if it could not be executed, 75 on a readiness
  /// timeout, 1 if the host itself failed.
  int exit_code = 0;
  pid_t pid = -1;
  bool ready = false;
  bool timed_out = false;
  /// The host's parent died (its PDEATHSIG arrived): the payload was killed.
  bool parent_died = false;
  /// stop_when_ready did stop it (exit_code is then 0).
  bool stopped_when_ready = false;
  /// How the payload ended, when it ran.
  std::optional<ExitStatus> status;
  /// Why it failed or was stopped, for people; empty on a plain exit.
  std::string message;
};

/// Runs the payload to completion:
/// - spawned in its own process group, stdin /dev/null, PR_SET_PDEATHSIG
///   SIGKILL (it dies with the host), fds exactly 0, 1, 2;
/// - this process becomes a child subreaper (until this returns) and reaps
///   every child it gets (the payload and the payload's orphans);
/// - SIGTERM/INT/HUP/QUIT/USR1/USR2 received by the host go to the payload's
///   group; if the host's parent has died (getppid() changed: the signal was
///   the host's own PDEATHSIG), the group is SIGKILLed instead;
/// - readiness per `opts.ready`, with its timeout;
/// - after the payload exits, whatever is left of its group is stopped and
///   reaped, so the host leaves nothing behind.
/// Event-driven: one epoll over a signalfd, the notify socket, the output
/// pipes and a timerfd.
/// REQUIRES: the calling thread lives until this returns (PDEATHSIG follows
/// the thread); the handled signals are blocked in every other thread (see
/// BlockSignals); nobody else in the process reaps children meanwhile.
PayloadResult RunPayload(const PayloadHostOptions& opts);

/// The signals the host forwards to the payload's group.
inline constexpr int kForwardedSignals[] = {SIGTERM, SIGINT, SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2};

}  // namespace dflash
