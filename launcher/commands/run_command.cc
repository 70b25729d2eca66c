// `dflash-launch run run.toml`: config -> plan -> supervise -> summary -> exit code.
#include <dirent.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <csignal>
#include <cstdlib>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <map>

#include "common/exit_codes.h"
#include "common/fd.h"
#include "common/printable.h"
#include "common/private_files.h"
#include "common/secure_path.h"
#include "common/signal_fd.h"
#include "common/spawn.h"
#include "contract/spool_layout.h"
#include "launcher/commands/commands.h"
#include "launcher/commands/front_door.h"
#include "launcher/commands/resume_said.h"
#include "launcher/control/control_server.h"
#include "launcher/plan/holder_lock.h"
#include "launcher/plan/port_reservation.h"
#include "launcher/commands/fd_limit.h"
#include "launcher/supervise/cgroup_tree.h"
#include "launcher/control/live_runs.h"
#include "launcher/cluster/store_session.h"
#include "launcher/supervise/supervisor.h"
#include "launcher/commands/supervisor_log.h"
#include "launcher/report/training_report.h"
#include "launcher/report/summary_json.h"
#include "launcher/plan/torch_version.h"

namespace dflash {

namespace {

// The run's hidden-state frames live in RAM (/dev/shm): nobody reads them after the run. Removed without
// following a link (another user's symlink in a shared /dev/shm must not make us delete their target), then
// the run's and the spool root's directories if that left them empty, so nothing of the run stays behind.
void RemoveRunSpool(const Plan& plan, spdlog::logger* log) {
  const std::string& root = plan.config.run.spool_dir;
  UniqueFd rootfd(::open(root.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
  if (!rootfd) return;  // never made (no spool role), or not ours to walk
  std::string err;
  uint64_t files = 0;
  if (plan.nnodes > 1) {
    UniqueFd runfd(OpenBeneath(rootfd.get(), plan.run_id, O_RDONLY | O_DIRECTORY));
    if (runfd && !RemoveTreeAt(runfd.get(), "node_" + std::to_string(plan.node_rank), &files, &err) && log)
      log->warn("spool {}: {}", plan.SpoolDir(), err);
    ::unlinkat(rootfd.get(), plan.run_id.c_str(), AT_REMOVEDIR);  // fails while another node's is there
  } else if (!RemoveTreeAt(rootfd.get(), plan.run_id, &files, &err) && log) {
    log->warn("spool {}: {}", plan.SpoolDir(), err);
  }
  ::rmdir(root.c_str());  // ENOTEMPTY while another run of this config uses it: that is fine
}

/// Whether a process was stopped by hand before it finished (`ctl stop`, a stop signal by `ctl signal`, `ctl stop
/// all`): the run exits 0 then, but its work is not done and its checkpoints are to be resumed.
bool StoppedByHandBeforeItFinished(const RunSummary& summary) {
  for (const ProcessSummary& p : summary.processes) {
    const AttemptRecord* a = p.attempts.empty() ? nullptr : &p.attempts.back();
    if (a && a->outcome == AttemptOutcome::kStoppedByCtl && (a->exit_code != 0 || a->signal != 0)) return true;
  }
  return false;
}

/// A run that did not finish (`unfinished`: it failed, or was stopped) keeps a spool whose consumers checkpoint (it
/// has pending/, made by dflash_launch.Checkpoint): the frames there and in done/ are what `run --resume`
/// continues from, and the checkpoints name them (docs/checkpoints.md). Any other spool goes.
void RemoveRunSpoolUnlessResumable(const Plan& plan, bool unfinished, spdlog::logger* log) {
  struct stat st;
  const std::string pending = spool::layout::Under(plan.SpoolDir(), spool::layout::kPending);
  if (unfinished && ::lstat(pending.c_str(), &st) == 0 && S_ISDIR(st.st_mode)) {
    if (log)
      log->info("spool {} kept: its frames go with the run's checkpoints; `dflash-launch run --run-id {} --resume` "
                "continues from them (remove it otherwise)", plan.SpoolDir(), plan.run_id);
    return;
  }
  RemoveRunSpool(plan, log);
}

}  // namespace
namespace {

std::string MakeRunId(const std::string& name) {
  char stamp[32];
  std::time_t t = std::time(nullptr);
  std::strftime(stamp, sizeof stamp, "%Y%m%d-%H%M%S", std::localtime(&t));
  return name + "-" + stamp + "-" + std::to_string(::getpid());
}

/// Whether a live launcher holds `path` (a run's run.lock; `holder` says who),
/// looked at without writing to it: the run dir may be an ended run's history.
bool RunLockHeld(const std::string& path, std::string* holder) {
  UniqueFd fd(::open(path.c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC));
  if (!fd || ::flock(fd.get(), LOCK_SH | LOCK_NB) == 0 || errno != EWOULDBLOCK) return false;
  char buf[512];
  ssize_t n = ::pread(fd.get(), buf, sizeof buf - 1, 0);
  *holder = n > 0 ? std::string(buf, static_cast<size_t>(n)) : "another dflash-launch";
  while (!holder->empty() && (holder->back() == '\n' || holder->back() == '\0')) holder->pop_back();
  *holder = Printable(*holder);  // text, never escape sequences for the terminal
  return true;
}

/// The attempt dir after the last one in the run dir `dirfd` (0 if none).
int NextAttempt(int dirfd) {
  int next = 0;
  int fd = ::dup(dirfd);
  DIR* d = fd >= 0 ? ::fdopendir(fd) : nullptr;
  if (!d) {
    if (fd >= 0) ::close(fd);
    return 0;
  }
  while (dirent* e = ::readdir(d)) {
    std::string n = e->d_name;
    if (n.rfind("attempt_", 0) != 0 || n.size() == 8 || n.find_first_not_of("0123456789", 8) != std::string::npos)
      continue;
    next = std::max(next, std::atoi(n.c_str() + 8) + 1);
  }
  ::closedir(d);
  return next;
}

/// The config, this node's plan, and whether the plan fits this host: what `run` checks before it makes anything.
Status LoadRunPlan(const RunOptions& opts, char** env, RunConfig* config, Plan* plan) {
  if (Status s = LoadConfigFile(opts.config, config); !s.ok()) return s;
  if (Status s = CommandsRun(*config, env); !s.ok()) return s;
  if (Status s = BuiltinInstalled(*config, opts.bin_dir, /*warn_only=*/false); !s.ok()) return s;
  if (Status s = PlanThisNode(*config, opts.nodes, opts.run_id, MakeRunId(config->run.name), opts.bin_dir, env, plan);
      !s.ok())
    return s;
  return HostLimitsFit(*plan, env);
}

/// RaiseFdLimit's outcome, said on stderr at once and in supervisor.log once it is open.
struct FdLimitRaised {
  bool ok = false;
  std::string note, err;
};

FdLimitRaised RaiseFdLimitForRun(const Plan& plan) {
  FdLimitRaised fds;
  size_t port_locks = 0;  // one per named port of each process and warm-up, held for the run
  for (const auto* list : {&plan.warmups, &plan.processes})
    for (const ProcessPlan& p : *list) port_locks += plan.RoleOf(p).ports.size();
  fds.ok = RaiseFdLimit(plan.processes.size(), &fds.note, &fds.err, port_locks);
  if (!fds.ok) std::fprintf(stderr, "dflash-launch: warning: %s\n", fds.err.c_str());
  return fds;
}

/// An existing run dir without --resume: another run's history. Says whose, exit 69.
Status RefuseUsedRunId(const Plan& plan) {
  if (std::string holder; RunLockHeld(plan.run_dir + "/run.lock", &holder))
    return Status::Error(exit_code::kInUse, "dflash-launch: run id " + plan.run_id + " is in use (" + plan.run_dir +
                                                ") by " + holder + "; pick another --run-id\n");
  return Status::Error(exit_code::kInUse,
                       "dflash-launch: run id " + plan.run_id + " was used before (" + plan.run_dir +
                           " exists): this run's logs and events would mix with that one's; pick another --run-id, "
                           "or add --resume to continue it\n");
}

/// One launcher per run id (per node): `run_lock` holds run.lock until we exit.
Status LockRunDir(const Plan& plan, UniqueFd* run_lock) {
  std::string holder;
  switch (TryHolderLock(plan.run_dir + "/run.lock", HolderRecord("run " + plan.run_id), run_lock, &holder,
                        plan.Files().file)) {
    case HolderLockResult::kAcquired:
      break;
    case HolderLockResult::kHeld:
      return Status::Error(exit_code::kInUse, "dflash-launch: run id " + plan.run_id + " is in use (" +
                                                  plan.run_dir + ") by " + holder + "; pick another --run-id\n");
    case HolderLockResult::kFailed:
      return Status::Error(exit_code::kCannotCreate, "dflash-launch: cannot lock the run dir: " + holder + "\n");
  }
  return Status::Ok();
}

/// --resume: this launch's attempts follow the run dir's last (`run_fd`), its events the earlier ones.
Status ResumeRunDir(Plan* plan, int run_fd, const PathUse& run_use) {
  plan->resumed = true;
  plan->attempt_base = NextAttempt(run_fd);
  // Its history must be ours to continue: an events.jsonl of another user's, a link or a hard link would be
  // refused when the supervisor opens it, and the run would go on without recording its events.
  std::string events_err;
  if (!UniqueFd(OpenPrivateFile(plan->run_dir + "/events.jsonl", O_WRONLY | O_APPEND, plan->Files(), run_use,
                                &events_err)))
    return Status::Error(exit_code::kCannotCreate, "dflash-launch: cannot resume run " + plan->run_id + ": " +
                                                       events_err + "; nothing was started\n");
  return Status::Ok();
}

/// The run dir (and the cache dir) made, checked and locked (`run_lock`, held for the run); a reused one
/// resumed.
Status MakeRunDir(const RunOptions& opts, const RunConfig& config, Plan* plan, UniqueFd* run_lock) {
  std::string err;
  auto cannot = [&err] { return Status::Error(exit_code::kCannotCreate, "dflash-launch: " + err + "\n"); };
  // The run dir is ours alone, made through nothing another user could swap
  // (common/private_files.h); an existing one is another run's history, never
  // mixed into unless --resume says to continue it.
  const PathUse run_use = RunDirUse();
  if (!CheckSecurePath(plan->run_dir, run_use, &err)) return cannot();
  struct stat run_st {};
  const bool reused = ::lstat(plan->run_dir.c_str(), &run_st) == 0;
  if (reused && !opts.resume) return RefuseUsedRunId(*plan);
  UniqueFd run_fd;
  if (!MakePrivateDir(plan->run_dir, plan->Files(), run_use, &run_fd, &err) ||
      !MakeDirs(config.run.cache_dir, 0700, &err))
    return cannot();
  // The spool's frames are loaded by the drafters: a <run_id>/ there that is not
  // ours could feed them another user's tensors. Its maker (the builtin roles)
  // refuses it too; refusing here means nothing is spawned.
  if (PathUse spool_use{"spool dir", "they could replace the hidden-state frames and the shared weights", false};
      !CheckSecurePath(plan->SpoolDir(), spool_use, &err))
    return cannot();
  // One launcher per run id (per node): before anything in the run dir is written to.
  if (Status s = LockRunDir(*plan, run_lock); !s.ok()) return s;
  if (reused) {  // held by us now: nobody else adds attempts meanwhile
    if (Status s = ResumeRunDir(plan, run_fd.get(), run_use); !s.ok()) return s;
  }
  run_fd.reset();  // every file below is opened through the same checks; a tight fd limit needs this one
  return Status::Ok();
}

/// <run_dir>/supervisor.log with the run's first lines: this node, its ports, the config's warnings (also on
/// stderr). Null if it cannot be opened (said on stderr).
std::shared_ptr<spdlog::logger> OpenRunLog(const Plan& plan) {
  std::string err;
  auto log = OpenSupervisorLog(plan.run_dir + "/supervisor.log", plan.Files(), &err);
  if (!log) {
    std::fprintf(stderr, "dflash-launch: %s\n", err.c_str());
    return nullptr;
  }
  if (plan.resumed) log->info("resumed run {}: attempts from attempt_{}", plan.run_id, plan.attempt_base);
  log->info("node {} of {}, MASTER_ADDR={} MASTER_PORT={}", plan.node_rank, plan.nnodes, plan.master_addr,
            plan.master_port);
  for (const auto* list : {&plan.warmups, &plan.processes})
    for (const ProcessPlan& p : *list)
      for (size_t i = 0; i < p.ports.size() && i < plan.RoleOf(p).ports.size(); ++i)
        log->info("{} port {}={} (held for the run)", p.name, plan.RoleOf(p).ports[i], p.ports[i]);
  if (std::string w = FormatWarnings(ConfigWarnings(plan.config)); !w.empty()) {
    std::fputs(w.c_str(), stderr);
    log->warn("{}", w);
  }
  return log;
}

Console::Options ConsoleOptionsFor(const RunOptions& opts, const Plan& plan) {
  Console::Options co;
  // The roles with more than one process here: theirs are the lines said alike.
  if (plan.config.run.console_dedup && !opts.no_dedup) {
    std::map<std::string, int> count;
    for (const ProcessPlan& p : plan.processes) ++count[plan.RoleOf(p).name];
    for (const auto& [role, n] : count)
      if (n > 1) co.dedup_roles.push_back(role);
  }
  co.color = opts.color;
  // The live status block only on a terminal that can move its cursor.
  const char* term = std::getenv("TERM");
  co.live = !opts.plain && ::isatty(1) == 1 && !(term != nullptr && std::string(term) == "dumb");
  return co;
}

/// Lists the run for `dflash-launch ps` and `ctl RUN_ID`; unlisted, it goes on, and says so.
void ListRun(const Plan& plan, const std::string& config, RunRegistration* registration, Console* console,
             spdlog::logger& log) {
  RunEntry entry;
  entry.run_id = plan.run_id;
  std::error_code fs_ec;
  entry.run_dir = std::filesystem::absolute(plan.run_dir, fs_ec).lexically_normal().string();
  entry.config = std::filesystem::absolute(config, fs_ec).lexically_normal().string();
  std::string err;
  if (!registration->Register(entry, &err)) {
    log.warn("not listed for `dflash-launch ps`: {}", err);
    console->Supervisor("[dflash] warning: not listed for `dflash-launch ps`: " + err);
  }
}

/// What the children start from, and the store's coordinator wired to the supervisor's rounds and failures.
SupervisorOptions SupervisorOptionsFor(const Plan& plan, const RunConfig& config, CgroupMode cgroup_mode,
                                       const StoreSession& store) {
  SupervisorOptions so;
  so.base_env = CurrentEnvironment();
  if (auto sd = GetEnvVar(so.base_env, "NOTIFY_SOCKET")) so.systemd_notify_socket = std::string(*sd);
  UnsetEnvVar(&so.base_env, "NOTIFY_SOCKET");  // never pass the supervisor's own on
  // The store's password reaches the processes as a 0600 file (DFLASH_STORE_SECRET_FILE), not as a
  // variable every child of theirs inherits.
  if (!config.run.store_password_env.empty()) UnsetEnvVar(&so.base_env, config.run.store_password_env);
  so.cgroup = cgroup_mode;
  NodeCoordinator* coord = store.coordinator.get();
  if (PrivateStore* ps = store.private_store.get()) {
    so.kept.pid = ps->pid();
    so.kept.ended = [ps](const std::string& how) { return ps->Ended(how); };
  }
  if (coord) {
    so.node_rounds = plan.nnodes > 1;
    so.on_round_request = [coord](int round, const std::string& why) { coord->RequestRound(round, why); };
    so.on_round_stopped = [coord](int round) { coord->RoundStopped(round); };
    so.on_failure = [coord](const std::string& process, int code, const std::string& reason) {
      coord->PublishFailure(process, code, reason);
    };
  }
  return so;
}

/// <run_dir>/control.sock, served from the supervisor's loop (docs/control.md).
/// Without it the run goes on, uncontrollable: say so, do not fail.
void ServeControl(const Plan& plan, Supervisor* sup, ControlServer* control, Console* console,
                  spdlog::logger& log) {
  std::string err;
  if (!control->Open(plan.run_dir, &err) ||
      !sup->AddWatch(control->fd(), [control, sup] { control->OnReadable(sup->control()); }, &err)) {
    log.warn("no control socket: {}", err);
    console->Supervisor("[dflash] warning: no control socket (`dflash-launch ctl` cannot reach this run): " + err);
    control->Close();
  }
}

/// The store's events, on the supervisor's loop: said, or carried out by the supervisor.
void CarryOutStoreEvents(NodeCoordinator* coord, Supervisor* sup, Console* console, spdlog::logger& log) {
  for (const NodeCoordinator::Event& e : coord->TakeEvents()) {
    using K = NodeCoordinator::Event::Kind;
    switch (e.kind) {
      case K::kInfo: log.info("store: {}", e.text); console->Supervisor("[dflash] " + e.text); break;
      case K::kWarn:
        log.warn("store: {}", e.text);
        console->Supervisor("[dflash] warning: " + e.text);
        break;
      case K::kBarrier: break;
      case K::kStop:
        sup->StopForNode({e.culprit, e.text, e.exit_code, e.record});
        break;
      case K::kBeginRound: sup->BeginRound(e.round, e.text); break;
      case K::kStartRound: sup->StartRound(e.round); break;
    }
  }
}

/// The supervisor's run, its control socket and the store's events served from its loop: `rc` and `summary`
/// are the run's. False if the store's events cannot be watched: nothing ran, the store session is closed,
/// and the launcher exits 1.
bool Supervise(const Plan& plan, const SupervisorOptions& so, Console* console,
               const std::shared_ptr<spdlog::logger>& log, StoreSession* store, int* rc, RunSummary* summary) {
  NodeCoordinator* coord = store->coordinator.get();
  Supervisor sup(plan, so, console, log);
  ControlServer control;
  ServeControl(plan, &sup, &control, console, *log);
  std::string err;
  if (coord &&
      !sup.AddWatch(coord->event_fd(), [&] { CarryOutStoreEvents(coord, &sup, console, *log); }, &err)) {
    log->error("cannot watch the store's events: {}", err);
    console->Supervisor("[dflash] cannot watch the store's events: " + err);
    CloseStoreSession(plan, exit_code::kFailure, err, log, store);
    return false;
  }
  *rc = sup.Run();
  if (coord) sup.RemoveWatch(coord->event_fd());
  control.Close();  // before the registry entry goes: `ps` never lists a run whose socket is gone
  // supervisor.log lines lost to a full disk: a fact the verdict takes into account, told before it is built.
  if (std::string loss = SupervisorLogLoss(*log); !loss.empty()) sup.RecordsIncomplete(loss);
  *summary = sup.Summary();  // built once by the core: the culprit, another node's included, as it judged it
  if (!summary->records_error.empty()) *rc = summary->exit_code;
  return true;
}

/// The run's records after it: loss.svg, summary.json, the summary table on the console. Returns the exit
/// code: `rc`, or the verdict's when a full disk under the log dir left the records incomplete.
int WriteRunRecords(const Plan& plan, int rc, RunSummary* summary, Console* console, spdlog::logger& log) {
  const PathUse run_use = RunDirUse();
  std::string err;
  // A full disk under the log dir while the records themselves are written (supervisor.log's losses were told to
  // the core before its verdict): the one change after it, since the verdict cannot know that its own record
  // failed (RunVerdict::RecordsIncomplete).
  auto incomplete = [&](const std::string& what) {
    summary->RecordsIncomplete(what);
    rc = summary->exit_code;
  };
  if (std::string svg = LossPlotSvg(*summary); !svg.empty() &&  // training's loss curves (training_report.h)
      !WritePrivateFileAtomic(plan.run_dir + "/loss.svg", svg, plan.Files(), run_use, &err))
    incomplete("cannot write " + plan.run_dir + "/loss.svg: " + err);
  std::string summary_path = plan.run_dir + "/summary.json";
  if (!WritePrivateFileAtomic(summary_path, SummaryJson(*summary).dump(2) + "\n", plan.Files(), run_use, &err))
    incomplete("cannot write " + summary_path + ": " + err);
  if (!summary->records_error.empty()) console->Supervisor("[dflash] error: " + summary->records_error);
  console->Supervisor("\n" + SummaryTable(*summary, console->color()));
  console->Flush();
  log.info("exit {}: {}", rc, summary->reason);
  return rc;
}

}  // namespace

int RunRun(const RunOptions& opts, char** env) {
  RunConfig config;
  Plan plan;
  if (Status s = LoadRunPlan(opts, env, &config, &plan); !s.ok()) return Say(s);

  std::string err;
  CgroupMode cgroup_mode;
  if (!ParseCgroupMode(std::getenv("DFLASH_CGROUP"), &cgroup_mode, &err)) {
    std::fprintf(stderr, "dflash-launch: %s\n", err.c_str());
    return exit_code::kUsage;
  }
  // Before anything is opened: the soft fd limit up to the hard one. Short
  // even so: say it now; the processes that cannot get their fds fail.
  const FdLimitRaised fds = RaiseFdLimitForRun(plan);
  UniqueFd run_lock;
  if (Status s = MakeRunDir(opts, config, &plan, &run_lock); !s.ok()) return Say(s);
  // MASTER_PORT and the role ports: chosen ("auto") or checked, and held until we exit.
  PortReservations ports;
  std::string port_warning;
  Status reserved = ReserveRunPorts(&plan, &ports, &port_warning);
  if (!port_warning.empty()) std::fprintf(stderr, "dflash-launch: warning: %s\n", port_warning.c_str());
  if (!reserved.ok()) return Say(reserved);
  std::shared_ptr<spdlog::logger> log = OpenRunLog(plan);
  if (!log) return exit_code::kCannotCreate;
  // Before any thread exists (the console writer): these signals are taken
  // only from the supervisor's signalfd, in its loop.
  BlockSignals(Supervisor::HandledSignals(plan));
  std::signal(SIGPIPE, SIG_IGN);  // a closed console is an error return, not a death
  // With a store (docs/multinode.md): registered, and every node at the start
  // barrier, before anything starts. After BlockSignals: its thread must not take them.
  StoreSession store;
  if (!plan.store.empty()) {
    auto say = [](const std::string& note) { std::fprintf(stderr, "dflash-launch: %s\n", note.c_str()); };
    if (Status opened = OpenStoreSession(&plan, &ports, CurrentEnvironment(), log, say, &store); !opened.ok())
      return Say(opened);
  }

  Console console(ConsoleOptionsFor(opts, plan));
  for (const std::string& line : ResumeSaid(plan)) {  // before any spawn: what this launch goes on from
    log->info("{}", line);
    console.Supervisor("[dflash] " + line);
  }
  // `dflash-launch ps` and `ctl RUN_ID` find the run here; gone when we are.
  RunRegistration registration;
  ListRun(plan, opts.config, &registration, &console, *log);
  SupervisorOptions so = SupervisorOptionsFor(plan, config, cgroup_mode, store);
  if (!fds.note.empty()) log->info(fds.note);
  if (!fds.ok) log->warn(fds.err);
  int rc;
  RunSummary summary;
  if (!Supervise(plan, so, &console, log, &store, &rc, &summary)) return exit_code::kFailure;
  // Done (and the failure, if ours) for the other nodes before this one unregisters.
  CloseStoreSession(plan, rc, summary.reason, log, &store);
  RemoveRunSpoolUnlessResumable(plan, rc != 0 || StoppedByHandBeforeItFinished(summary), log.get());
  // Every process has ended: their ports are free to go, and their fds are what the
  // summary's private write (a dir fd and a temp file) needs under a tight fd limit.
  ports.locks.clear();
  console.EndLive();  // the summary goes below the last frame, plainly
  return WriteRunRecords(plan, rc, &summary, &console, *log);
}

}  // namespace dflash
