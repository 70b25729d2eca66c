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
#include "launcher/commands.h"
#include "launcher/fd_limit.h"
#include "launcher/run_cgroup.h"
#include "launcher/supervisor.h"
#include "launcher/supervisor_log.h"
#include "launcher/torch_version.h"

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
  if (!LoadConfigOrReport(opts.config, &config) || !CommandsRunOrReport(config, env)) return exit_code::kConfig;
  PlanOptions po;
  po.run_id = opts.run_id.empty() ? MakeRunId(config.run.name) : opts.run_id;
  po.bin_dir = opts.bin_dir;
  po.torch_version = TorchVersionFor;
  po.launcher_env = EnvironmentList(env);
  Plan plan = BuildPlan(config, po);  // the run id needs the config's name: no LoadPlanOrReport here

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
  auto log = OpenSupervisorLog(plan.run_dir + "/supervisor.log", &err);
  if (!log) {
    std::fprintf(stderr, "dflash-launch: %s\n", err.c_str());
    return exit_code::kCannotCreate;
  }
  // Before any thread exists (the console writer): these signals are taken
  // only from the supervisor's signalfd, in its loop.
  BlockSignals(Supervisor::HandledSignals(plan));
  std::signal(SIGPIPE, SIG_IGN);  // a closed console is an error return, not a death

  Console::Options co;
  co.color = opts.color;
  Console console(co);
  SupervisorOptions so;
  so.base_env = CurrentEnvironment();
  if (auto sd = GetEnvVar(so.base_env, "NOTIFY_SOCKET")) so.systemd_notify_socket = std::string(*sd);
  UnsetEnvVar(&so.base_env, "NOTIFY_SOCKET");  // never pass the supervisor's own on
  so.cgroup = cgroup_mode;
  if (!fd_note.empty()) log->info(fd_note);
  if (!fds_ok) log->warn(fd_err);
  int rc;
  RunSummary summary;
  {
    Supervisor sup(plan, so, &console, log);
    rc = sup.Run();
    summary = sup.Summary();
  }
  // The run's hidden-state frames live in RAM (/dev/shm): nobody reads them after the run.
  std::error_code ec;
  std::filesystem::remove_all(plan.SpoolDir(), ec);
  if (!WriteFileAtomic(plan.run_dir + "/summary.json", SummaryJson(summary).dump(2) + "\n", &err))
    console.Supervisor("[dflash] cannot write summary.json: " + err);
  console.Supervisor("\n" + SummaryTable(summary, console.color()));
  console.Flush();
  log->info("exit {}: {}", rc, summary.reason);
  return rc;
}

}  // namespace dflash
