// Spawning one process of the run: its stdout/stderr pipes into the log router, its cgroup leaf, its
// environment, the spawn itself (the exec's outcome comes later, on its exec-status pipe), and that outcome.
// Nothing here logs between fork and exec: Spawn (common/spawn.h) does the child's side.
#include <fcntl.h>
#include <sys/epoll.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <utility>

#include "common/exit_codes.h"
#include "common/fd.h"
#include "common/spawn.h"
#include "contract/env_vars.h"
#include "launcher/supervise/supervisor_internal.h"

namespace dflash {

void Supervisor::Impl::AddStream(size_t i, bool is_stderr, UniqueFd fd) {
  const ProcView p = core_.view(i);
  std::string path = plan_.AttemptPath(*p.plan, p.attempt, is_stderr ? "stderr.log" : "stdout.log");
  std::string err;
  int id = router_.Add(std::move(fd), p.plan->name, is_stderr, path, &err);
  // Loud (console, supervisor.log, summary.json) but never fatal: the pipe is still drained (console only).
  if (!err.empty())
    core_.AddWarning(p.plan->name + ": cannot log to " + path + ": " + err +
                     (id >= 0 ? "; its output is shown on the console only" : ""));
  if (id < 0) return;
  if (static_cast<size_t>(id) >= stream_owner_.size()) stream_owner_.resize(id + 1, -1);
  stream_owner_[id] = static_cast<int>(i);
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.u64 = Tag(kTagStream, static_cast<uint64_t>(id));
  ::epoll_ctl(epoll_.get(), EPOLL_CTL_ADD, router_.fd(id), &ev);
  (is_stderr ? os_[i].err_stream : os_[i].out_stream) = id;
}

void Supervisor::Impl::CloseStream(int sid) {
  if (sid < 0 || static_cast<size_t>(sid) >= stream_owner_.size() || stream_owner_[sid] < 0) return;
  Os& o = os_[static_cast<size_t>(stream_owner_[sid])];
  if (o.out_stream == sid) o.out_stream = -1;
  if (o.err_stream == sid) o.err_stream = -1;
  stream_owner_[sid] = -1;
  ::epoll_ctl(epoll_.get(), EPOLL_CTL_DEL, router_.fd(sid), nullptr);
  router_.Remove(sid);
}

void Supervisor::Impl::DoSpawn(size_t i) {
  const ProcView p = core_.view(i);
  const ProcessPlan& pp = *p.plan;
  const RoleSpec& role = plan_.RoleOf(pp);
  // Each end owned at once: a second pipe2 that fails must not leak the first.
  UniqueFd out_r, out_w, err_r, err_w;
  for (auto [r, w] : {std::pair{&out_r, &out_w}, std::pair{&err_r, &err_w}}) {
    int fds[2];
    if (::pipe2(fds, O_CLOEXEC) != 0)
      return core_.OnSpawnFailed(i, ErrnoMessage("pipe2", errno), exit_code::kFailure);
    r->reset(fds[0]);
    w->reset(fds[1]);
  }
  AddStream(i, false, std::move(out_r));  // also creates <run_dir>/attempt_<k>/
  AddStream(i, true, std::move(err_r));
  std::string cg_err;
  UniqueFd cgroup_procs = guard_.Leaf(i, p.attempt, &cg_err);
  if (guard_.cgroup() && !cgroup_procs) return core_.OnSpawnFailed(i, cg_err, exit_code::kFailure);

  SpawnOptions so;
  so.argv = plan_.ExecArgv(pp);
  SpawnContext ctx;
  ctx.notify_socket = notify_.address();
  ctx.run_token = run_token_;  // inherited by its whole tree: the guardian's marker
  so.env = SpawnEnvironment(options_.base_env, plan_.ProcessEnv(pp, p.attempt, &ctx));
  // A warm-up-mode process takes no gate (no dflash-worker sets this), but it does reuse the warm-up's
  // cache: dflash_launch.gate_role() says so, as the console does.
  if (p.gate.warmup_mode && p.gate.role == GateRole::kReuse)
    SetEnvVar(&so.env, env::kGateRole, "reuse");
  so.cgroup_procs_fd = cgroup_procs ? cgroup_procs.get() : -1;
  so.cwd = role.cwd;
  so.stdout_fd = out_w.get();
  so.stderr_fd = err_w.get();
  so.group = SpawnOptions::Group::kNewSession;  // its own session and group: one kill(-pid) reaches it
  so.death_signal = SIGKILL;                    // dies with the supervisor; its payload dies with it
  so.wait_for_exec = false;                     // the next fork overlaps this exec; OnExecStatus learns

  Child child;
  std::string err;
  bool ok = dflash::Spawn(so, &child, &err);
  if (!ok) {
    if (child.pid <= 0)  // before fork (not in PATH, pipe2, fork): nothing to reap
      return core_.OnSpawnFailed(i, err, child.exit_code != 0 ? child.exit_code : exit_code::kFailure);
    // Forked, it already exited 127/126: Reap() collects it.
    return core_.OnSpawnFailed(i, err, child.exit_code, child.pid);
  }
  guard_.Spawned(child.pid);  // its own session: the guardian's second marker
  pid_t pid = child.pid;
  os_[i].exec = std::move(child);
  os_[i].payload = VerifiedPid{};
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.u64 = Tag(kTagExec, static_cast<uint64_t>(i));
  ::epoll_ctl(epoll_.get(), EPOLL_CTL_ADD, os_[i].exec.exec_status.get(), &ev);
  core_.OnSpawned(i, pid, /*exec_pending=*/true);
}

void Supervisor::Impl::OnExecStatus(size_t i) {
  Os& o = os_[i];
  if (!o.exec.exec_status) return;
  ::epoll_ctl(epoll_.get(), EPOLL_CTL_DEL, o.exec.exec_status.get(), nullptr);
  std::string err;
  bool ok = FinishSpawn(&o.exec, &err);
  core_.OnExecResult(i, ok, err);
}

}  // namespace dflash
