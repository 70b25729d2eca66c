#include "testing/process.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>

#include "common/spawn.h"

namespace dflash::test {
namespace {

/// Sets up `child_fd` of the child from `o`; the parent's end of a pipe lands in `*mine`.
bool AddOutput(posix_spawn_file_actions_t* fa, const Output& o, int child_fd, UniqueFd* mine,
               UniqueFd* theirs, std::string* err) {
  switch (o.kind) {
    case Output::Kind::kInherit:
      return true;
    case Output::Kind::kDevNull:
      return posix_spawn_file_actions_addopen(fa, child_fd, "/dev/null", O_WRONLY, 0) == 0;
    case Output::Kind::kFile:
      return posix_spawn_file_actions_addopen(fa, child_fd, o.path.c_str(), O_WRONLY | O_CREAT | O_TRUNC,
                                              0600) == 0;
    case Output::Kind::kPipe: {
      int p[2];
      if (::pipe2(p, O_CLOEXEC) != 0) return *err = ErrnoMessage("pipe2", errno), false;
      mine->reset(p[0]);
      theirs->reset(p[1]);
      return posix_spawn_file_actions_adddup2(fa, p[1], child_fd) == 0;
    }
  }
  return false;
}

}  // namespace

bool StartProcess(const ProcessOptions& o, Process* p, std::string* err) {
  if (o.argv.empty()) return *err = "StartProcess: empty argv", false;
  std::vector<std::string> env = o.env ? *o.env : CurrentEnvironment();
  for (const auto& [name, value] : o.set_env) SetEnvVar(&env, name, value);

  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawnattr_t attr;
  posix_spawnattr_init(&attr);
  UniqueFd out_w, err_w;
  Process got;
  bool ok = posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0) == 0 &&
            AddOutput(&fa, o.out, 1, &got.out, &out_w, err) && AddOutput(&fa, o.err, 2, &got.err, &err_w, err);
  for (const auto& [here, there] : o.fds) ok = ok && posix_spawn_file_actions_adddup2(&fa, here, there) == 0;

  sigset_t none, all;
  sigemptyset(&none);
  sigfillset(&all);
  short flags = POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF;
  if (o.new_session) flags |= POSIX_SPAWN_SETSID;
  posix_spawnattr_setsigmask(&attr, &none);
  posix_spawnattr_setsigdefault(&attr, &all);
  posix_spawnattr_setflags(&attr, flags);

  std::vector<char*> argv, envp;
  for (const auto& a : o.argv) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  for (const auto& e : env) envp.push_back(const_cast<char*>(e.c_str()));
  envp.push_back(nullptr);

  int rc = ok ? ::posix_spawnp(&got.pid, argv[0], &fa, &attr, argv.data(), envp.data()) : -1;
  posix_spawn_file_actions_destroy(&fa);
  posix_spawnattr_destroy(&attr);
  if (!ok) {
    if (err->empty()) *err = "StartProcess(" + o.argv[0] + "): cannot set up the child's fds";
    return false;
  }
  if (rc != 0) return *err = ErrnoMessage("posix_spawnp(" + o.argv[0] + ")", rc), false;
  *p = std::move(got);
  return true;
}

pid_t StartHelper(std::vector<std::string> argv) {
  ProcessOptions o;
  o.argv = std::move(argv);
  o.out = o.err = Output::Inherit();
  Process p;
  std::string err;
  if (!StartProcess(o, &p, &err)) {
    ADD_FAILURE() << err;
    return -1;
  }
  return p.pid;
}

int WaitForExit(pid_t pid) {
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0) {
    if (errno != EINTR) return -1;
  }
  return status;
}

int ExitCodeOf(int wait_status) {
  if (wait_status < 0) return -1;
  if (WIFEXITED(wait_status)) return WEXITSTATUS(wait_status);
  if (WIFSIGNALED(wait_status)) return 128 + WTERMSIG(wait_status);
  return -1;
}

Finished RunProcess(const ProcessOptions& o) {
  Finished f;
  Process p;
  std::string err;
  if (!StartProcess(o, &p, &err)) {
    ADD_FAILURE() << err;
    return f;
  }
  struct Stream {
    int fd;
    std::string* text;
  };
  std::vector<Stream> open;
  if (p.out) open.push_back({p.out.get(), &f.out});
  if (p.err) open.push_back({p.err.get(), &f.err});
  char buf[65536];
  while (!open.empty()) {
    std::vector<pollfd> pfds;
    for (const Stream& s : open) pfds.push_back({s.fd, POLLIN, 0});
    if (::poll(pfds.data(), pfds.size(), -1) < 0) {
      if (errno == EINTR) continue;
      ADD_FAILURE() << ErrnoMessage("poll", errno);
      break;
    }
    for (size_t i = pfds.size(); i-- > 0;) {
      if (pfds[i].revents == 0) continue;
      ssize_t n = ::read(open[i].fd, buf, sizeof buf);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) {
        open.erase(open.begin() + static_cast<long>(i));
        continue;
      }
      open[i].text->append(buf, static_cast<size_t>(n));
    }
  }
  f.status = WaitForExit(p.pid);
  f.exit_code = ExitCodeOf(f.status);
  return f;
}

Finished RunProcess(std::vector<std::string> argv) {
  ProcessOptions o;
  o.argv = std::move(argv);
  return RunProcess(o);
}

}  // namespace dflash::test
