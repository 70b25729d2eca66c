// The supervisor's epoll shell: spawns one dflash-worker (or the payload
// itself) per planned process and carries out what SupervisorCore decides,
// feeding it what the OS reports (signalfd, the notify socket, output pipes,
// exec outcomes, reaped children), with cgroups and orphan sweeps so nothing
// outlives the run. Never links LibTorch, never touches CUDA.
#pragma once

#include <spdlog/logger.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "launcher/console/console.h"
#include "launcher/control/control.h"
#include "launcher/core/node_culprit.h"
#include "launcher/plan/plan.h"
#include "launcher/supervise/death_guard.h"
#include "launcher/core/run_summary.h"

namespace dflash {

struct SupervisorOptions {
  /// The environment every child starts from (the launcher's own, without its
  /// NOTIFY_SOCKET); the plan's variables go on top.
  std::vector<std::string> base_env;
  /// The supervisor's own NOTIFY_SOCKET (run under systemd), or empty.
  std::string systemd_notify_socket;
  /// cgroup v2 use (DFLASH_CGROUP); see launcher/supervise/death_guard.h.
  CgroupMode cgroup = CgroupMode::kAuto;
  /// A child of the launcher that is not a process of the run and that another part owns (the store
  /// session's private redis-server): never swept as an orphan. When it is reaped, its owner says what its
  /// end means (`ended`, on the loop thread, with how it ended: "exited with code 1"), and the run stops for it.
  struct KeptChild {
    pid_t pid = -1;  ///< -1: none
    std::function<NodeStop(const std::string& how)> ended;
  };
  KeptChild kept;

  // Nodes (a coordination store, launcher/cluster/node_coordinator.h): set, restarts wider than one
  // process become rounds of every node, and these are called on the loop thread.
  bool node_rounds = false;
  std::function<void(int current_round, const std::string& why)> on_round_request;
  std::function<void(int round)> on_round_stopped;
  /// The run's culprit was chosen on this node (a failure with no restart left): once.
  std::function<void(const std::string& process, int exit_code, const std::string& reason)> on_failure;
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

  /// The run's summary, built once by the core (SupervisorCore::Summary).
  RunSummary Summary() const;
  /// The run's own records are incomplete (`what`): told to the core before Summary (its verdict says so).
  void RecordsIncomplete(const std::string& what);

  /// The live-control verbs (launcher/control/control.h), answered on the loop thread:
  /// hand it to the control socket's server. Valid for the Supervisor's life.
  ControlHandler& control();

  /// Watches `fd` (EPOLLIN) in the event loop: `on_readable` runs on the loop
  /// thread. May be called before Run() or from a callback. The fd stays the
  /// caller's; RemoveWatch before closing it. False with `err` if epoll refuses it.
  bool AddWatch(int fd, std::function<void()> on_readable, std::string* err);
  void RemoveWatch(int fd);

  // Nodes: what the coordinator saw, carried out on the loop thread (from a watch's callback).
  void BeginRound(int round, const std::string& why);
  void StartRound(int round);
  /// SupervisorCore::StopForNode: `stop.record` becomes summary.json's node_culprit.
  void StopForNode(NodeStop stop);

  /// SIGCHLD, SIGINT, SIGTERM, SIGHUP and [run] forward_signals.
  static std::vector<int> HandledSignals(const Plan& plan);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace dflash
