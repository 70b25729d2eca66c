// `dflash-launch run run.toml`: config -> plan -> supervise -> summary -> exit code.
#include <sys/stat.h>
#include <unistd.h>

#include <csignal>
#include <cstdlib>
#include <cstdio>
#include <ctime>
#include <filesystem>

#include "common/exit_codes.h"
#include "common/fd.h"
#include "common/signal_fd.h"
#include "common/spawn.h"
#include "launcher/commands/commands.h"
#include "launcher/control/control_server.h"
#include "launcher/plan/holder_lock.h"
#include "launcher/plan/port_reservation.h"
#include "launcher/supervise/fd_limit.h"
#include "launcher/supervise/cgroup_tree.h"
#include "launcher/control/live_runs.h"
#include "launcher/cluster/store_session.h"
#include "launcher/supervise/supervisor.h"
#include "launcher/supervise/supervisor_log.h"
#include "launcher/plan/torch_version.h"

namespace dflash {
namespace {

std::string MakeRunId(const std::string& name) {
  char stamp[32];
  std::time_t t = std::time(nullptr);
  std::strftime(stamp, sizeof stamp, "%Y%m%d-%H%M%S", std::localtime(&t));
  return name + "-" + stamp + "-" + std::to_string(::getpid());
}

}  // namespace

int RunRun(const RunOptions& opts, char** env) {
  RunConfig config;
  if (!LoadConfigOrReport(opts.config, &config)) return exit_code::kConfig;
  if (!CommandsRunOrReport(config, env)) return exit_code::kConfig;
  if (!BuiltinInstalledOrReport(config, opts.bin_dir, /*warn_only=*/false)) return exit_code::kConfig;
  Plan plan;
  if (int rc = PlanThisNode(config, opts.nodes, opts.run_id, MakeRunId(config.run.name), opts.bin_dir, env, &plan);
      rc != 0)
    return rc;
  if (!HostLimitsOrReport(plan, env)) return exit_code::kConfig;

  std::string err;
  CgroupMode cgroup_mode;
  if (!ParseCgroupMode(std::getenv("DFLASH_CGROUP"), &cgroup_mode, &err)) {
    std::fprintf(stderr, "dflash-launch: %s\n", err.c_str());
    return exit_code::kUsage;
  }
  // Before anything is opened: the soft fd limit up to the hard one. Short
  // even so: say it now; the processes that cannot get their fds fail.
  std::string fd_note, fd_err;
  bool fds_ok = RaiseFdLimit(plan.processes.size(), &fd_note, &fd_err);
  if (!fds_ok) std::fprintf(stderr, "dflash-launch: warning: %s\n", fd_err.c_str());
  if (!MakeDirs(plan.run_dir, 0755, &err) || !MakeDirs(config.run.cache_dir, 0700, &err)) {
    std::fprintf(stderr, "dflash-launch: %s\n", err.c_str());
    return exit_code::kCannotCreate;
  }
  // One launcher per run id (per node): before anything in the run dir is written to.
  UniqueFd run_lock;
  std::string holder;
  switch (TryHolderLock(plan.run_dir + "/run.lock", HolderRecord("run " + plan.run_id), &run_lock, &holder)) {
    case HolderLockResult::kAcquired:
      break;
    case HolderLockResult::kHeld:
      std::fprintf(stderr, "dflash-launch: run id %s is in use (%s) by %s; pick another --run-id\n",
                   plan.run_id.c_str(), plan.run_dir.c_str(), holder.c_str());
      return exit_code::kInUse;
    case HolderLockResult::kFailed:
      std::fprintf(stderr, "dflash-launch: cannot lock the run dir: %s\n", holder.c_str());
      return exit_code::kCannotCreate;
  }
  // MASTER_PORT and the role ports: chosen ("auto") or checked, and held until we exit.
  PortReservations ports;
  if (int rc = ReservePlanPortsOrReport(&plan, &ports); rc != 0) return rc;
  auto log = OpenSupervisorLog(plan.run_dir + "/supervisor.log", &err);
  if (!log) {
    std::fprintf(stderr, "dflash-launch: %s\n", err.c_str());
    return exit_code::kCannotCreate;
  }
  log->info("node {} of {}, MASTER_ADDR={} MASTER_PORT={}", plan.node_rank, plan.nnodes, plan.master_addr,
            plan.master_port);
  if (std::string w = FormatWarnings(ConfigWarnings(plan.config)); !w.empty()) {
    std::fputs(w.c_str(), stderr);
    log->warn("{}", w);
  }
  // Before any thread exists (the console writer): these signals are taken
  // only from the supervisor's signalfd, in its loop.
  BlockSignals(Supervisor::HandledSignals(plan));
  std::signal(SIGPIPE, SIG_IGN);  // a closed console is an error return, not a death
  // With a store (docs/multinode.md): registered, and every node at the start
  // barrier, before anything starts. After BlockSignals: its thread must not take them.
  StoreSession store;
  if (!plan.store.empty()) {
    if (int rc = OpenStoreSession(&plan, &ports, CurrentEnvironment(), log, &store); rc != 0) return rc;
  }

  Console::Options co;
  co.color = opts.color;
  // The live status block only on a terminal that can move its cursor.
  const char* term = std::getenv("TERM");
  co.live = !opts.plain && ::isatty(1) == 1 && !(term != nullptr && std::string(term) == "dumb");
  Console console(co);
  // `dflash-launch ps` and `ctl RUN_ID` find the run here; gone when we are.
  RunRegistration registration;
  {
    RunEntry entry;
    entry.run_id = plan.run_id;
    std::error_code fs_ec;
    entry.run_dir = std::filesystem::absolute(plan.run_dir, fs_ec).lexically_normal().string();
    entry.config = std::filesystem::absolute(opts.config, fs_ec).lexically_normal().string();
    if (!registration.Register(entry, &err)) {
      log->warn("not listed for `dflash-launch ps`: {}", err);
      console.Supervisor("[dflash] warning: not listed for `dflash-launch ps`: " + err);
    }
  }
  SupervisorOptions so;
  so.base_env = CurrentEnvironment();
  if (auto sd = GetEnvVar(so.base_env, "NOTIFY_SOCKET")) so.systemd_notify_socket = std::string(*sd);
  UnsetEnvVar(&so.base_env, "NOTIFY_SOCKET");  // never pass the supervisor's own on
  so.cgroup = cgroup_mode;
  NodeCoordinator* coord = store.coordinator.get();
  if (store.private_store) so.keep_pid = store.private_store->pid();
  if (coord) {
    so.node_rounds = plan.nnodes > 1;
    so.on_round_request = [coord](int round, const std::string& why) { coord->RequestRound(round, why); };
    so.on_round_stopped = [coord](int round) { coord->RoundStopped(round); };
    so.on_failure = [coord](const std::string& process, int code, const std::string& reason) {
      coord->PublishFailure(process, code, reason);
    };
  }
  nlohmann::json node_record;  // what another node's failure said, if that ended the run
  if (!fd_note.empty()) log->info(fd_note);
  if (!fds_ok) log->warn(fd_err);
  int rc;
  RunSummary summary;
  {
    Supervisor sup(plan, so, &console, log);
    // <run_dir>/control.sock, served from the supervisor's loop (docs/control.md).
    // Without it the run goes on, uncontrollable: say so, do not fail.
    ControlServer control;
    if (!control.Open(plan.run_dir, &err) ||
        !sup.AddWatch(control.fd(), [&] { control.OnReadable(sup.control()); }, &err)) {
      log->warn("no control socket: {}", err);
      console.Supervisor("[dflash] warning: no control socket (`dflash-launch ctl` cannot reach this run): " + err);
      control.Close();
    }
    if (coord && !sup.AddWatch(coord->event_fd(), [&] {
          for (const NodeCoordinator::Event& e : coord->TakeEvents()) {
            using K = NodeCoordinator::Event::Kind;
            switch (e.kind) {
              case K::kInfo: log->info("store: {}", e.text); console.Supervisor("[dflash] " + e.text); break;
              case K::kWarn:
                log->warn("store: {}", e.text);
                console.Supervisor("[dflash] warning: " + e.text);
                break;
              case K::kBarrier: break;
              case K::kStop:
                if (node_record.is_null()) node_record = e.record;
                sup.StopForNode(e.culprit, e.text);
                break;
              case K::kBeginRound: sup.BeginRound(e.round, e.text); break;
              case K::kStartRound: sup.StartRound(e.round); break;
            }
          }
        }, &err)) {
      log->error("cannot watch the store's events: {}", err);
      console.Supervisor("[dflash] cannot watch the store's events: " + err);
      CloseStoreSession(plan, exit_code::kFailure, err, log, &store);
      return exit_code::kFailure;
    }
    rc = sup.Run();
    if (coord) sup.RemoveWatch(coord->event_fd());
    control.Close();  // before the registry entry goes: `ps` never lists a run whose socket is gone
    summary = sup.Summary();
    if (!sup.node_culprit().empty()) {
      summary.culprit = sup.node_culprit();
      summary.node_culprit = node_record;
    }
  }
  // Done (and the failure, if ours) for the other nodes before this one unregisters.
  CloseStoreSession(plan, rc, summary.reason, log, &store);
  // The run's hidden-state frames live in RAM (/dev/shm): nobody reads them after the run.
  std::error_code ec;
  std::filesystem::remove_all(plan.SpoolDir(), ec);
  console.EndLive();  // the summary goes below the last frame, plainly
  // A full disk under the log dir: the run's own record is incomplete. Said on
  // the console and in the exit reason, never a silent cut; a run whose
  // processes all succeeded then exits 1, since its record cannot be trusted.
  auto incomplete = [&](const std::string& what) {
    summary.records_error += (summary.records_error.empty() ? "" : "; ") + what;
    if (rc == exit_code::kOk) {
      rc = summary.exit_code = exit_code::kFailure;
      summary.reason = "every process succeeded, but the run's records are incomplete: " + what;
    } else {
      summary.reason += "; and the run's records are incomplete: " + what;
    }
  };
  if (std::string loss = SupervisorLogLoss(*log); !loss.empty()) incomplete(loss);
  std::string summary_path = plan.run_dir + "/summary.json";
  if (!WriteFileAtomic(summary_path, SummaryJson(summary).dump(2) + "\n", &err))
    incomplete("cannot write " + summary_path + ": " + err);
  if (!summary.records_error.empty()) console.Supervisor("[dflash] error: " + summary.records_error);
  console.Supervisor("\n" + SummaryTable(summary, console.color()));
  console.Flush();
  log->info("exit {}: {}", rc, summary.reason);
  return rc;
}

}  // namespace dflash
