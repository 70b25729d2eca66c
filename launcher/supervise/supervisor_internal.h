// The supervisor's epoll shell, one object shared by its parts; not part of the API
// (launcher/supervise/supervisor.h is). Each part is a file with one job:
//   supervisor.cc          the public face: Supervisor's methods, the watches, the shell's construction
//   supervisor_loop.cc     setup, the epoll loop and its timeout, dispatch of what epoll saw, the probes'
//                          delivery, the end of the loop
//   supervisor_actions.cc  carrying out the core's actions (CoreAction), in order
//   supervisor_spawn.cc    spawning a process: its pipes, its cgroup leaf, its exec's outcome
//   supervisor_reap.cc     reaping, the end of a process, its leftovers and the orphan sweeps
//   supervisor_reports.cc  the notify socket (reports, MAINPID claims) and what the shell reports: events.jsonl,
//                          the live status, systemd
//   supervisor_metrics.cc  the Prometheus metrics: served from the start, filled from the loop (docs/metrics.md)
#pragma once

#include <spdlog/logger.h>
#include <sys/epoll.h>
#include <sys/types.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "common/duration.h"
#include "common/fd.h"
#include "common/notify.h"
#include "common/signal_fd.h"
#include "common/spawn.h"
#include "launcher/console/console.h"
#include "launcher/console/log_router.h"
#include "launcher/control/control.h"
#include "launcher/metrics/run_metrics.h"
#include "launcher/plan/plan.h"
#include "launcher/supervise/death_guard.h"
#include "launcher/supervise/pid_claim.h"
#include "launcher/supervise/probe_runner.h"
#include "launcher/supervise/supervisor.h"
#include "launcher/core/supervisor_core.h"
#include "worker/protocol.h"

namespace dflash {

struct Supervisor::Impl : public ControlHandler {
  // An epoll event's data: what kind of fd (high 32 bits) and which one (low 32).
  static constexpr uint64_t kTagSignal = 1, kTagNotify = 2, kTagStream = 3, kTagExec = 4, kTagWatch = 5,
                            kTagProbe = 6;
  static uint64_t Tag(uint64_t kind, uint64_t id) { return kind << 32 | id; }

  /// How often, at least, the console's live status is refreshed.
  static constexpr Millis kStatusPeriod{1000};
  /// How often the metrics registry is filled while it is served (a scrape sees values at most this old).
  static constexpr Millis kMetricsPeriod{2000};

  // supervisor.cc
  Impl(const Plan& plan, SupervisorOptions options, Console* console, std::shared_ptr<spdlog::logger> log);

  // ControlHandler: the core answers; what it decided is carried out at once.
  RunStatus Status() override {
    RunStatus st = core_.Status();
    if (metrics_) st.metrics_url = metrics_->url();
    return st;
  }
  ControlReply Apply(const ControlRequest& request) override {
    if (request.verb == ControlVerb::kMetrics) {  // `ctl metrics`: fresh values, the text a scrape gets
      RefreshMetrics(true);
      return {true, "", {{"text", metrics_ ? metrics_->Text() : std::string()}}};
    }
    ControlReply r = core_.Apply(request);
    Drain();
    return r;
  }

  /// The OS side of each process: its pipes and its exec's outcome.
  struct Os {
    int out_stream = -1, err_stream = -1;
    Child exec;  // until OnExecStatus reads its outcome
    VerifiedPid payload;  // its MAINPID=, once checked (launcher/supervise/pid_claim.h)
  };

  // supervisor_loop.cc
  int Run();
  /// The loop's fds, events.jsonl and the guardian; false (start_error_ says why) if the run cannot start.
  bool SetUp();
  /// Turns of epoll_wait until the core is done.
  void Loop();
  /// After the loop: leftovers, the guardian, the last output; the run's exit code.
  int Finish();
  /// The epoll timeout from `now`; `asked`: the wake-up it stands for.
  int NextTimeoutMs(SteadyTime now, SteadyTime* asked) const;
  void Dispatch(const epoll_event* events, int n);
  /// Tries that ended go to the core -- after any exit already waiting is
  /// reaped, so an answer that came after its process died never counts.
  void DeliverProbes();
  void TakeQueued(epoll_event* events);

  // supervisor_actions.cc
  void Drain();
  void Execute(const CoreAction& a);

  // supervisor_spawn.cc
  void DoSpawn(size_t i);
  void OnExecStatus(size_t i);
  void AddStream(size_t i, bool is_stderr, UniqueFd fd);
  void CloseStream(int sid);

  // supervisor_reap.cc
  void Reap();
  void Ended(size_t i);
  void KillAll();
  void CheckReuseHitTheCache(size_t i);
  void SweepOrphans(bool all) { SweepOrphansImpl(all); }
  std::vector<pid_t> SweepOrphansImpl(bool all);
  void FinalSweep();

  // supervisor_reports.cc
  void OnNotify();
  void CheckMainPid(size_t i, NotifyFields* f);
  void TellSystemd(const std::string& message);
  void WriteEvent(nlohmann::json event);
  void PublishStatus(bool force);
  // supervisor_metrics.cc
  void StartMetrics();
  void StopMetrics();
  /// Fills the registry from the core, at most once a kMetricsPeriod unless `force` (`ctl metrics`).
  void RefreshMetrics(bool force);

  void Info(const std::string& text) {
    if (log_) log_->info(text);
    if (console_) console_->Supervisor("[dflash] " + text);
  }
  void Warn(const std::string& text) {
    if (log_) log_->warn(text);
    if (console_) console_->Supervisor("[dflash] warning: " + text);
  }

  const Plan& plan_;
  SupervisorOptions options_;
  Console* console_;
  std::shared_ptr<spdlog::logger> log_;
  SupervisorCore core_;
  LogRouter router_;
  SignalFd signals_;
  NotifyListener notify_;
  UniqueFd epoll_;
  UniqueFd events_file_;  // <run_dir>/events.jsonl
  std::unique_ptr<ProbeRunner> probes_;  // ready = tcp/http, liveness (after epoll_)
  std::vector<Os> os_;
  std::vector<int> stream_owner_;  // stream id -> proc index
  std::vector<std::function<void()>> watches_;
  std::vector<int> watch_fds_;
  RunGuard guard_;
  std::string run_token_;       // DFLASH_RUN_TOKEN of every process of this run
  std::string start_error_;     // Run() could not even set up its loop (fds exhausted, say)
  bool sweep_pending_ = false;  // a process or orphan ended since the last SweepOrphans
  bool failure_told_ = false;   // on_failure was called
  bool status_dirty_ = true;
  SteadyTime last_status_{};
  std::unique_ptr<RunMetrics> metrics_;  // after the core: its exposer's threads stop first
  SteadyTime last_metrics_{};
  SteadyTime t0_ = std::chrono::steady_clock::now();
};

}  // namespace dflash
