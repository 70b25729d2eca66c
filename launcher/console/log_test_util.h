// Real processes and a minimal event loop for the log path's tests and
// benchmark: what the supervisor does, reduced to what the router needs.
#pragma once

#include <fcntl.h>
#include <sys/epoll.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "common/fd.h"
#include "launcher/console/log_router.h"

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
