// The supervisor: spawns one dflash-worker per planned process, watches them in
// one event loop (signalfd, the workers' notify socket, their output pipes,
// deadlines), restarts by policy, stops everything cleanly and names the
// first failure as the culprit. Never links LibTorch, never touches CUDA.
#pragma once

#include <spdlog/logger.h>

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/fd.h"
#include "common/notify.h"
#include "common/signal_fd.h"
#include "common/spawn.h"
#include "contract/readiness.h"
#include "launcher/console.h"
#include "launcher/log_router.h"
#include "launcher/plan.h"
#include "launcher/restart_policy.h"
#include "launcher/run_guard.h"
#include "launcher/run_summary.h"

namespace dflash {

/// kWaiting: not started yet, held until its role's warm-up has compiled.
enum class ProcState { kNotStarted, kWaiting, kFailed, kStarting, kRunning, kBackoff, kStopping, kExited, kFatal };
const char* ProcStateName(ProcState s);

struct SupervisorOptions {
  /// The environment every child starts from (the launcher's own, without its
  /// NOTIFY_SOCKET); the plan's variables go on top.
  std::vector<std::string> base_env;
  /// The supervisor's own NOTIFY_SOCKET (run under systemd), or empty.
  std::string systemd_notify_socket;
  /// cgroup v2 use (DFLASH_CGROUP); see launcher/run_guard.h.
  CgroupMode cgroup = CgroupMode::kAuto;
};

class Supervisor {
 public:
  /// REQUIRES: the signals in HandledSignals(plan) are blocked in every thread
  /// (BlockSignals in main() before the Console thread starts); the calling
  /// thread runs Run() and lives as long as the children (PDEATHSIG).
  Supervisor(const Plan& plan, SupervisorOptions options, Console* console,
             std::shared_ptr<spdlog::logger> log);
  ~Supervisor();

  /// Runs until every process has ended; returns the run's exit code: 0 if all
  /// succeeded, else the culprit's (128+N for signal N), or 128+N when a
  /// signal N told the supervisor to stop.
  int Run();

  RunSummary Summary() const;

  /// SIGCHLD, SIGINT, SIGTERM, SIGHUP and [run] forward_signals.
  static std::vector<int> HandledSignals(const Plan& plan);

 private:
  struct Proc {
    const ProcessPlan* plan = nullptr;
    ProcState state = ProcState::kNotStarted;
    pid_t pid = -1;          // while it runs; -1 once reaped
    pid_t last_pid = -1;
    pid_t payload_pid = -1;  // MAINPID= from the worker
    int attempt = -1;        // spawns so far - 1
    SteadyTime started{}, ended{};
    int exit_code = -1;
    int signal = 0;
    bool stop_sent = false;       // we asked it to stop: its end is not a failure
    bool restart_pending = false; // BACKOFF (or stopping for a role/all restart)
    SteadyTime restart_at{};
    SteadyTime kill_at{};         // SIGKILL after the grace, while STOPPING
    bool ready_once = false;
    bool culprit = false;
    bool collateral = false;
    std::string reason;
    int out_stream = -1, err_stream = -1;
    nlohmann::json gate;
    std::string error_message;  // from its TORCHELASTIC_ERROR_FILE
    std::string worker_error;   // X_DFLASH_ERROR= from the worker ("cannot execute ...")
    std::string payload_exit;   // X_DFLASH_EXIT= ("killed by SIGSEGV (core dumped)")
    int payload_signal = 0;     // X_DFLASH_SIGNAL=
    double ready_s = 0;         // X_DFLASH_READY_S=: spawn to ready (the compile, for a gated payload)
    bool direct = false;        // no dflash-worker in between (Plan::NeedsWorker)
    Child exec;                 // its exec's outcome, until OnExecStatus reads it
    std::optional<Readiness> readiness;  // direct processes only: their readiness, judged here
    bool timed_out = false;     // not ready in time: the run exits 75
    bool spawn_failed = false;  // could not be started (pipes, fork, exec: 126/127): FAILED, never collateral
    int64_t memory_peak = -1;   // max memory.peak of its attempts' cgroups (-1: not measured)
  };

  void Spawn(Proc& p);
  /// A role's warm-up ended: start the role on the warm cache, or fail the run.
  void OnWarmupExit(Proc& p, const std::string& how);
  /// Whether the role's processes must wait for its warm-up (not yet done).
  bool HeldForWarmup(const Proc& p) const;
  void OnSignal(int sig);
  void Reap();
  void OnExit(Proc& p, const ExitStatus& st);
  void OnNotify();
  void OnDeadlines();
  void BeginStop(const std::string& reason);
  void StopProc(Proc& p, const std::string& why);
  void KillAll();
  /// A process ended: what it left behind dies with it (its cgroup leaf, its
  /// process groups at once; re-parented orphans at the next sweep).
  void KillLeftoversOf(Proc& p);
  /// Our children that are no process of ours: orphans re-parented to us (a
  /// subreaper). Kills those whose process has ended (all of them if `all`),
  /// leaves the live ones' alone, and logs whose each was. O(our children).
  void SweepOrphans(bool all);
  std::vector<pid_t> SweepOrphansImpl(bool all);  // returns the pids it SIGKILLed
  /// After the loop: kill and reap every orphan left, until none comes back.
  void FinalSweep();
  void SetState(Proc& p, ProcState s, const std::string& why = "");
  void Fail(Proc& p, const std::string& reason, bool fatal);
  RestartTracker& TrackerFor(const Proc& p);
  bool Alive(const Proc& p) const { return p.pid > 0; }
  bool Done() const;
  int NextTimeoutMs() const;
  void AddStream(Proc& p, bool is_stderr, UniqueFd fd);
  /// Stream ended (EOF) or is abandoned: out of epoll, out of the router.
  void CloseStream(int sid);
  void TellSystemd(const std::string& message);
  void ReportGate(const Proc& p, const std::string& state);
  void MarkReady(Proc& p, const std::string& why);
  void OnExecStatus(Proc& p);
  void CheckReuseHitTheCache(Proc& p);
  void Info(const std::string& text);
  void Warn(const std::string& text);

  const Plan& plan_;
  SupervisorOptions options_;
  Console* console_;
  std::shared_ptr<spdlog::logger> log_;
  LogRouter router_;
  SignalFd signals_;
  NotifyListener notify_;
  UniqueFd epoll_;
  std::vector<Proc> procs_;
  std::vector<std::unique_ptr<RestartTracker>> trackers_;  // by TrackerIndex
  std::vector<int> stream_owner_;                         // stream id -> proc index
  bool stopping_ = false;
  int stop_signal_ = 0;         // the signal that told us to stop, if any
  int interrupts_ = 0;
  std::string stop_reason_;
  std::string start_error_;  // Run() could not even set up its loop (fds exhausted, say)
  int culprit_ = -1;
  bool told_ready_ = false;
  std::vector<std::string> warnings_;
  std::vector<bool> role_warm_;        // by role index: its warm-up succeeded (or it has none)
  std::vector<bool> warmup_published_; // by role index: its warm-up published READY or found it
  SteadyTime t0_{};
  RunGuard guard_;
  std::string run_token_;        // DFLASH_RUN_TOKEN of every process of this run
  bool sweep_pending_ = false;   // a process or orphan ended since the last SweepOrphans
};

}  // namespace dflash
