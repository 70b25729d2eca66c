#include "launcher/plan/port_reservation.h"

#include <fcntl.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <random>

#include "common/exit_codes.h"
#include "common/secure_path.h"

#include "launcher/plan/holder_lock.h"

namespace dflash {
namespace {

constexpr int kAutoLow = 20000, kAutoHigh = 32767;  // [low, high): below ip_local_port_range (32768-60999)
constexpr int kAutoTries = 200;

enum class Probe { kBindable, kTaken, kNoSocket };

/// Binds a throw-away socket of `family` to the port on every address.
/// EAFNOSUPPORT (no IPv6 on the host) counts as bindable. kNoSocket: no socket
/// to probe with (out of fds, memory): says nothing about the port.
Probe TryBindProbe(int family, int port, std::string* why) {
  UniqueFd s(::socket(family, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!s) {
    if (errno == EAFNOSUPPORT) return Probe::kBindable;
    *why = ErrnoMessage("socket", errno);
    return Probe::kNoSocket;
  }
  int one = 1;
  ::setsockopt(s.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);  // as TCPStore: TIME_WAIT is no obstacle
  int rc;
  if (family == AF_INET6) {
    ::setsockopt(s.get(), IPPROTO_IPV6, IPV6_V6ONLY, &one, sizeof one);  // the IPv4 probe covers the rest
    sockaddr_in6 a{};
    a.sin6_family = AF_INET6;
    a.sin6_addr = in6addr_any;
    a.sin6_port = htons(static_cast<uint16_t>(port));
    rc = ::bind(s.get(), reinterpret_cast<sockaddr*>(&a), sizeof a);
  } else {
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_ANY);
    a.sin_port = htons(static_cast<uint16_t>(port));
    rc = ::bind(s.get(), reinterpret_cast<sockaddr*>(&a), sizeof a);
  }
  if (rc == 0) return Probe::kBindable;
  if (family == AF_INET6 && errno == EADDRNOTAVAIL) return Probe::kBindable;  // IPv6 disabled
  *why = errno == EADDRINUSE ? "something on this host already uses it (" +
                                   std::string(family == AF_INET6 ? "IPv6" : "IPv4") + ")"
                             : ErrnoMessage("bind", errno);
  return Probe::kTaken;
}

Probe ProbePort(int port, std::string* why) {
  Probe v4 = TryBindProbe(AF_INET, port, why);
  return v4 != Probe::kBindable ? v4 : TryBindProbe(AF_INET6, port, why);
}

/// `dir` as a port lock dir of this user: made 0700 if missing, opened without following a link, and kept only if
/// it is a directory of ours that nobody else can write (one too open is ours to close: chmod 0700). False: `why`.
bool OwnPrivateDir(const std::string& dir, std::string* why) {
  if (::mkdir(dir.c_str(), 0700) != 0 && errno != EEXIST) {
    *why = ErrnoMessage("mkdir(" + dir + ")", errno);
    return false;
  }
  UniqueFd fd(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
  struct stat st {};
  if (!fd || ::fstat(fd.get(), &st) != 0) {
    *why = ErrnoMessage("open(" + dir + ", O_NOFOLLOW)", errno) + " (a symlink, or not a directory)";
    return false;
  }
  if (st.st_uid != ::geteuid()) {
    *why = dir + " is " + UserNameOf(st.st_uid) + "'s (uid " + std::to_string(st.st_uid) + "), not yours";
    return false;
  }
  if ((st.st_mode & 077) != 0 && ::fchmod(fd.get(), 0700) != 0) {
    *why = ErrnoMessage("chmod 0700 " + dir, errno);
    return false;
  }
  return true;
}

std::string LockPath(const std::string& dir, int port) { return dir + "/" + std::to_string(port) + ".lock"; }

}  // namespace

bool PortLockDir(std::string* dir, std::string* warning, std::string* err) {
  // Per user, never shared: a shared directory let any local user read which ports a run was about to use (and
  // bind them first), or plant a symlink at every <port>.lock so that no run could start. The same path first for
  // every session of the user (ssh, cron, a batch job), so the user's concurrent runs exclude each other.
  std::vector<std::string> candidates = {"/tmp/dflash-ports-" + std::to_string(::geteuid())};
  if (const char* xdg = std::getenv("XDG_RUNTIME_DIR"); xdg && xdg[0] == '/')
    candidates.push_back(std::string(xdg) + "/dflash-ports");
  if (const char* home = std::getenv("HOME"); home && home[0] == '/')
    candidates.push_back(std::string(home) + "/.cache/dflash-ports");
  std::string skipped;
  for (const std::string& c : candidates) {
    std::string why;
    if (c.find("/.cache/") != std::string::npos) ::mkdir(c.substr(0, c.rfind('/')).c_str(), 0700);
    if (OwnPrivateDir(c, &why)) {
      *dir = c;
      if (!skipped.empty())
        *warning = "port locks go to " + c + " (" + skipped + "): your runs that use another directory do not "
                   "exclude these ports";
      return true;
    }
    skipped += (skipped.empty() ? "" : "; ") + why;
  }
  *err = "no private directory for port locks: " + skipped;
  return false;
}

bool PortBindable(int port, std::string* why) { return ProbePort(port, why) == Probe::kBindable; }

ReserveResult ReservePort(const std::string& lock_dir, int port, const std::string& record, PortReservations* held,
                          std::string* err) {
  UniqueFd fd;
  std::string holder;
  int failed = 0;
  switch (TryHolderLock(LockPath(lock_dir, port), record, &fd, &holder, 0600, &failed)) {
    case HolderLockResult::kFailed:
      *err = holder;
      // Out of fds or memory: every port would fail alike. Else this port's file (a link, a directory) is bad.
      return failed == EMFILE || failed == ENFILE || failed == ENOMEM || failed == ENOSPC ? ReserveResult::kFailed
                                                                                          : ReserveResult::kBadLock;
    case HolderLockResult::kHeld:
      *err = "port " + std::to_string(port) + " is reserved by " + holder;
      return ReserveResult::kInUse;
    case HolderLockResult::kAcquired:
      break;
  }
  std::string why;
  switch (ProbePort(port, &why)) {  // fd closes on a return: the lock is dropped
    case Probe::kBindable:
      break;
    case Probe::kTaken:
      *err = "port " + std::to_string(port) + " is in use: " + why;
      return ReserveResult::kInUse;
    case Probe::kNoSocket:  // not the port's fault: another candidate would fail the same way
      *err = "cannot probe port " + std::to_string(port) + ": " + why;
      return ReserveResult::kFailed;
  }
  held->locks.push_back(std::move(fd));
  return ReserveResult::kReserved;
}

ReserveResult ReserveFreePort(const std::string& lock_dir, const std::string& record, int* port,
                              PortReservations* held, std::string* err) {
  std::mt19937 rng(std::random_device{}());
  std::uniform_int_distribution<int> pick(kAutoLow, kAutoHigh - 1);
  std::string last, bad;
  for (int i = 0; i < kAutoTries; ++i) {
    int candidate = pick(rng);
    ReserveResult r = ReservePort(lock_dir, candidate, record, held, &last);
    if (r == ReserveResult::kBadLock) {
      bad = last;  // skipped: another port is drawn, the run is not refused for one file
      continue;
    }
    if (r == ReserveResult::kFailed) {
      *err = last;
      return r;
    }
    if (r == ReserveResult::kReserved) {
      *port = candidate;
      return r;
    }
  }
  *err = "no free port in " + std::to_string(kAutoTries) + " tries in [" + std::to_string(kAutoLow) + ", " +
         std::to_string(kAutoHigh) + "); last: " + last + (bad.empty() ? "" : "; an unusable lock file: " + bad);
  return ReserveResult::kInUse;
}

ReserveResult ReservePlanPorts(Plan* plan, const std::string& lock_dir, PortReservations* held, std::string* err) {
  const std::string record = HolderRecord("run " + plan->run_id);
  auto one = [&](int* port, const std::string& what) {
    ReserveResult r = *port == 0 ? ReserveFreePort(lock_dir, record, port, held, err)
                                 : ReservePort(lock_dir, *port, record, held, err);
    if (r != ReserveResult::kReserved) *err = what + ": " + *err;
    return r;
  };
  if (plan->BindsMasterPort()) {
    if (ReserveResult r = one(&plan->master_port, "MASTER_PORT"); r != ReserveResult::kReserved) return r;
  }
  for (size_t i = 0; i < plan->roles.size(); ++i) {
    if (!plan->BindsRolePort(i)) continue;
    std::string what = "ROLE_MASTER_PORT of role " + plan->config.roles[i].name;
    if (ReserveResult r = one(&plan->roles[i].master_port, what); r != ReserveResult::kReserved) return r;
  }
  // Each warm-up is a world of one on this host with a port of its own.
  for (const ProcessPlan& w : plan->warmups) {
    std::string what = "MASTER_PORT of the warm-up " + w.name;
    if (ReserveResult r = one(&plan->roles[w.role_index].warmup_master_port, what); r != ReserveResult::kReserved) return r;
  }
  return ReserveResult::kReserved;
}

ReserveResult ReserveNamedPorts(Plan* plan, const std::string& lock_dir, PortReservations* held, std::string* err) {
  const std::string record = HolderRecord("run " + plan->run_id);
  for (std::vector<ProcessPlan>* list : {&plan->warmups, &plan->processes})
    for (ProcessPlan& p : *list) {
      const RoleSpec& role = plan->RoleOf(p);
      p.ports.resize(role.ports.size(), 0);
      for (size_t i = 0; i < role.ports.size(); ++i) {
        if (p.ports[i] > 0) continue;  // reserved already (a second call)
        ReserveResult r = ReserveFreePort(lock_dir, record, &p.ports[i], held, err);
        if (r != ReserveResult::kReserved) {
          *err = "port \"" + role.ports[i] + "\" of " + p.name + ": " + *err;
          return r;
        }
      }
    }
  return ReserveResult::kReserved;
}

Status ReserveRunPorts(Plan* plan, PortReservations* held, std::string* warning) {
  std::string lock_dir, err;
  if (!PortLockDir(&lock_dir, warning, &err))
    return Status::Error(exit_code::kCannotCreate, "dflash-launch: " + err + "\n");
  ReserveResult r = ReservePlanPorts(plan, lock_dir, held, &err);
  if (r == ReserveResult::kReserved) {
    r = ReserveNamedPorts(plan, lock_dir, held, &err);
    if (r == ReserveResult::kInUse)
      return Status::Error(exit_code::kInUse,
                           "dflash-launch: " + err + "; nothing was started. Free ports in [20000, 32767) on this "
                           "host (other dflash-launch runs hold theirs in " + lock_dir + "), or name fewer ports\n");
  }
  switch (r) {
    case ReserveResult::kReserved:
      return Status::Ok();
    case ReserveResult::kInUse:
      return Status::Error(exit_code::kInUse,
                           "dflash-launch: " + err + "; nothing was started. Use master_port = \"auto\" (the "
                           "default) for a free port, or another port" +
                               (plan->nnodes > 1 ? " (several nodes: or another run id, from which auto derives it)"
                                                 : "") + "\n");
    case ReserveResult::kFailed:
    case ReserveResult::kBadLock:
      break;
  }
  return Status::Error(exit_code::kCannotCreate,
                       "dflash-launch: cannot reserve ports: " + err + "; nothing was started\n");
}

}  // namespace dflash
