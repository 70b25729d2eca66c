#include "launcher/supervise/death_guard.h"

#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>

#include "common/proc_info.h"
#include "common/run_sweep.h"
#include "common/spawn.h"

namespace dflash {

RunGuard::~RunGuard() { Finish(); }

bool RunGuard::Start(const Options& o, std::string* err, std::vector<std::string>* notes) {
  if (o.mode != CgroupMode::kOff) {
    std::string why;
    if (cgroup_.Create(o.token, &why)) {
      notes->push_back("cgroup v2 sub-tree " + cgroup_.dir() + " (cgroup.kill" +
                       (cgroup_.has_memory() ? ", memory.peak)" : "; no memory controller here: no memory.peak)"));
    } else if (o.mode == CgroupMode::kRequire) {
      *err = "DFLASH_CGROUP=require, but no cgroup v2 sub-tree can be made: " + why;
      return false;
    } else {
      notes->push_back("no cgroup v2 sub-tree (" + why + "): processes are tracked by session and " +
                       "DFLASH_RUN_TOKEN");
    }
  }
  options_ = o;
  std::string e;
  if (!SpawnGuardian(KnownLines(), &e)) {
    notes->push_back("cannot start dflash-guardian: " + e + " (a SIGKILL of the launcher may leave processes behind)");
    return true;
  }
  first_start_ = ProcessStartTime(guardian_pid_);
  notes->push_back("dflash-guardian pid " + std::to_string(guardian_pid_) + " kills the run if the launcher dies");
  return true;
}

bool RunGuard::SpawnGuardian(const std::string& known, std::string* err) {
  // The guardian: new session, no death signal (it must outlive us), stdin =
  // a pipe whose write end only we hold.
  int p[2];
  if (::pipe2(p, O_CLOEXEC) != 0) {
    *err = ErrnoMessage("pipe2", errno);
    return false;
  }
  UniqueFd rd(p[0]), wr(p[1]);
  // What it must know is in its pipe before it exists: a SIGKILL of the
  // launcher right after the spawn still leaves a guardian that knows every
  // session (CI once killed it between the spawn and the telling: 5 of 9 lived).
  // What does not fit the pipe's buffer (thousands of sessions) follows below.
  size_t preloaded = PreloadPipe(wr.get(), known);
  std::string log_err;
  UniqueFd log(OpenPrivateFile(options_.log_path, O_WRONLY | O_APPEND, options_.log_mode, RunDirUse(), &log_err));
  // Without its log (a link or a full disk where it would be) it still guards: its stderr goes to /dev/null.
  SpawnOptions so;
  // The token through its environment, not argv: /proc/<pid>/cmdline is readable by every user, environ only by us.
  so.argv = {options_.bin_dir + "/dflash-guardian"};
  so.env = options_.env;
  SetEnvVar(&so.env, kRunTokenVar, options_.token);
  so.stdin_fd = rd.get();
  so.stdout_fd = kDevNullFd;
  so.stderr_fd = log ? log.get() : kDevNullFd;
  so.group = SpawnOptions::Group::kNewSession;
  Child child;
  if (!Spawn(so, &child, err)) {
    if (child.pid > 0) ::waitpid(child.pid, nullptr, 0);
    return false;
  }
  guardian_pid_ = child.pid;
  guardian_pipe_ = std::move(wr);
  if (preloaded < known.size()) {
    std::string rest = known.substr(preloaded);
    if (!WriteAll(guardian_pipe_.get(), rest, err)) guardian_pipe_.reset();
  }
  return true;
}

size_t RunGuard::PreloadPipe(int fd, const std::string& bytes) {
  // Non-blocking: nobody reads yet, so a full buffer must not stall us.
  int flags = ::fcntl(fd, F_GETFL);
  if (bytes.empty() || flags < 0 || ::fcntl(fd, F_SETFL, flags | O_NONBLOCK) != 0) return 0;
  size_t off = 0;
  while (off < bytes.size()) {
    ssize_t n = ::write(fd, bytes.data() + off, bytes.size() - off);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;  // EAGAIN: the rest after the spawn
    off += static_cast<size_t>(n);
  }
  ::fcntl(fd, F_SETFL, flags);
  return off;
}

bool RunGuard::Restart(std::string* err) {
  if (guardian_pid_ > 0) return true;
  if (!SpawnGuardian(KnownLines(), err)) return false;
  if (!guardian_pipe_) {
    *err = "the new dflash-guardian (pid " + std::to_string(guardian_pid_) + ") closed its pipe at once";
    return false;
  }
  return true;
}

std::string RunGuard::KnownLines() const {
  std::string lines;
  // The processes it must kill started before it: the first guardian's start
  // time bounds its sweep instead of its own (pids reused since are spared).
  if (first_start_ > 0) lines += "since " + std::to_string(first_start_) + "\n";
  if (cgroup_.active()) lines += "cgroup " + cgroup_.dir() + "\n";
  for (pid_t sid : sessions_) lines += "session " + std::to_string(sid) + "\n";
  return lines;
}

void RunGuard::Tell(const std::string& line) {
  if (!guardian_pipe_) return;
  std::string err;
  // A few bytes into a pipe the guardian drains: never blocks in practice; if
  // the guardian is gone (EPIPE, SIGPIPE is ignored), stop telling it.
  if (!WriteAll(guardian_pipe_.get(), line + "\n", &err)) guardian_pipe_.reset();
}

UniqueFd RunGuard::Leaf(size_t index, int attempt, std::string* err) {
  if (!cgroup_.active()) return UniqueFd();
  return cgroup_.MakeLeaf(LeafName(index, attempt), err);
}

void RunGuard::Spawned(pid_t sid) {
  sessions_.push_back(sid);
  Tell("session " + std::to_string(sid));
}

int64_t RunGuard::Ended(size_t index, int attempt) {
  if (!cgroup_.active()) return -1;
  std::string leaf = LeafName(index, attempt);
  std::string dir = cgroup_.LeafDir(leaf);
  RunCgroup::Kill(dir);
  int64_t peak = RunCgroup::MemoryPeak(dir);
  // Never wait here (the event loop): a leaf still busy with dying processes
  // is removed with the whole tree at Finish().
  RunCgroup::RemoveTree(dir);
  return peak;
}

void RunGuard::KillAll() {
  if (cgroup_.active()) RunCgroup::Kill(cgroup_.dir());
}

void RunGuard::Finish() {
  cgroup_.Destroy();
  if (guardian_pipe_) {
    Tell("done");
    guardian_pipe_.reset();
  }
  if (guardian_pid_ > 0) {
    int status;
    while (::waitpid(guardian_pid_, &status, 0) < 0 && errno == EINTR) {
    }
    guardian_pid_ = -1;
  }
}

}  // namespace dflash
