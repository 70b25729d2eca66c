#include "launcher/commands/fd_limit.h"

#include <sys/resource.h>

#include <cerrno>

#include "common/fd.h"

namespace dflash {

size_t FdsNeeded(size_t processes, size_t port_locks) {
  // Held per running process: 2 pipe read ends, 2 log files, 1 pidfd. Held
  // while one is being started: 2 pipe write ends, the exec-status pipe,
  // /dev/null, its cgroup.procs. Fixed: stdio, supervisor.log, epoll,
  // signalfd, notify socket, the guardian's pipe and log, the console, slack.
  // And one lock per named port (launcher/plan/port_reservation.h), held until the run ends.
  return 5 * processes + port_locks + 8 + 24;
}

bool RaiseFdLimit(size_t processes, std::string* note, std::string* err, size_t port_locks) {
  struct rlimit rl;
  if (::getrlimit(RLIMIT_NOFILE, &rl) != 0) {
    *err = ErrnoMessage("getrlimit(RLIMIT_NOFILE)", errno);
    return false;
  }
  // Children inherit the raised soft limit: Python's select() and old code
  // that loops to the soft limit are why systemd keeps 1024 as the default;
  // our children close every fd above 2 at spawn and are not select()-bound
  // by us. A payload that cares can lower its own.
  if (rl.rlim_cur < rl.rlim_max) {
    rlim_t old = rl.rlim_cur;
    rl.rlim_cur = rl.rlim_max;
    if (::setrlimit(RLIMIT_NOFILE, &rl) == 0)
      *note = "raised the soft file-descriptor limit from " + std::to_string(old) + " to " +
              (rl.rlim_max == RLIM_INFINITY ? std::string("unlimited") : std::to_string(rl.rlim_max));
    else if (::getrlimit(RLIMIT_NOFILE, &rl) != 0)
      rl.rlim_cur = old;
  }
  size_t need = FdsNeeded(processes, port_locks);
  if (rl.rlim_cur != RLIM_INFINITY && rl.rlim_cur < need) {
    *err = std::to_string(processes) + " processes" +
           (port_locks ? " and " + std::to_string(port_locks) + " named ports" : std::string()) + " need ~" +
           std::to_string(need) +
           " file descriptors in the launcher; the limit is " + std::to_string(rl.rlim_cur) + " (hard " +
           (rl.rlim_max == RLIM_INFINITY ? std::string("unlimited") : std::to_string(rl.rlim_max)) +
           "): raise it (ulimit -n, LimitNOFILE=, /etc/security/limits.conf) or some processes cannot start";
    return false;
  }
  return true;
}

}  // namespace dflash
