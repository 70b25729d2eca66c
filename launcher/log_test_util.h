// Real processes and a minimal event loop for the log path's tests and
// benchmark: what the supervisor does, reduced to what the router needs.
#pragma once

#include <fcntl.h>
#include <spawn.h>
#include <sys/epoll.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "common/fd.h"
#include "launcher/log_router.h"

extern char** environ;

namespace dflash::logtest {

/// A pipe for a test: r and w, O_CLOEXEC unless asked otherwise.
struct Pipe {
  UniqueFd r, w;
  explicit Pipe(int flags = O_CLOEXEC) {
    int p[2];
    if (::pipe2(p, flags) == 0) {
      r.reset(p[0]);
      w.reset(p[1]);
    }
  }
};

/// Reads `fd` to EOF on a thread: the console side of a test, started only
/// when the test wants the console to move.
class Drainer {
 public:
  explicit Drainer(int fd) : t_([this, fd] {
    char buf[65536];
    for (;;) {
      ssize_t n = ::read(fd, buf, sizeof buf);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) return;
      out_.append(buf, static_cast<size_t>(n));
    }
  }) {}
  /// REQUIRES: every write end is closed, or this never returns.
  std::string Join() {
    t_.join();
    return out_;
  }

 private:
  std::string out_;
  std::thread t_;
};

struct Child {
  pid_t pid = -1;
  UniqueFd out;  // read end of its stdout
  UniqueFd err;  // read end of its stderr
};

/// Spawns argv with stdout and stderr on two fresh pipes (O_CLOEXEC on our
/// ends, as the supervisor does) and stdin from /dev/null.
inline bool Spawn(const std::vector<std::string>& args, Child* c, std::string* err) {
  int o[2], e[2];
  if (::pipe2(o, O_CLOEXEC) != 0) return *err = ErrnoMessage("pipe2", errno), false;
  UniqueFd o_r(o[0]), o_w(o[1]);
  if (::pipe2(e, O_CLOEXEC) != 0) return *err = ErrnoMessage("pipe2", errno), false;
  UniqueFd e_r(e[0]), e_w(e[1]);
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_adddup2(&fa, o_w.get(), 1);
  posix_spawn_file_actions_adddup2(&fa, e_w.get(), 2);
  std::vector<char*> argv;
  for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  int rc = ::posix_spawn(&c->pid, argv[0], &fa, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&fa);
  if (rc != 0) return *err = ErrnoMessage("posix_spawn(" + args[0] + ")", rc), false;
  c->out = std::move(o_r);
  c->err = std::move(e_r);
  return true;
}

/// Waits for `pid`; returns its raw wait status, or -1.
inline int Wait(pid_t pid) {
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0) {
    if (errno != EINTR) return -1;
  }
  return status;
}

/// Runs the router over `ids` until every stream has ended or `deadline`
/// passes; returns false on the deadline (a blocked path shows up here, not as
/// a hung test). Level-triggered epoll, as the supervisor uses.
inline bool RunLoop(LogRouter* router, const std::vector<int>& ids,
                    std::chrono::steady_clock::time_point deadline, std::string* err) {
  UniqueFd ep(::epoll_create1(EPOLL_CLOEXEC));
  if (!ep) return *err = ErrnoMessage("epoll_create1", errno), false;
  size_t open = 0;
  for (int id : ids) {
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.u32 = static_cast<uint32_t>(id);
    if (::epoll_ctl(ep.get(), EPOLL_CTL_ADD, router->fd(id), &ev) != 0) {
      return *err = ErrnoMessage("epoll_ctl", errno), false;
    }
    ++open;
  }
  epoll_event events[32];
  while (open > 0) {
    if (std::chrono::steady_clock::now() > deadline) {
      *err = std::to_string(open) + " streams still open at the deadline";
      return false;
    }
    int n = ::epoll_wait(ep.get(), events, 32, 100);
    if (n < 0 && errno != EINTR) return *err = ErrnoMessage("epoll_wait", errno), false;
    for (int i = 0; i < n; ++i) {
      int id = static_cast<int>(events[i].data.u32);
      if (!router->OnReadable(id)) {
        ::epoll_ctl(ep.get(), EPOLL_CTL_DEL, router->fd(id), nullptr);
        --open;
      }
    }
  }
  return true;
}

}  // namespace dflash::logtest
