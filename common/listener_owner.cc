#include "common/listener_owner.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <memory>
#include <set>
#include <sstream>

#include "common/fd.h"
#include "common/proc_info.h"
#include "common/proc_scan.h"
#include "common/secure_path.h"

namespace dflash {
namespace {

constexpr const char* kListen = "0A";  // TCP_LISTEN in include/net/tcp_states.h, as /proc/net/tcp prints it

/// "0100007F:1F90" (IPv4) or 32 hex digits ":1F90" (IPv6): the kernel prints each
/// 32-bit word of the address in host byte order.
bool ParseProcAddress(const std::string& text, std::string* address, int* port) {
  size_t colon = text.find(':');
  if (colon == std::string::npos) return false;
  std::string hex = text.substr(0, colon);
  *port = static_cast<int>(std::strtol(text.c_str() + colon + 1, nullptr, 16));
  if (hex.size() != 8 && hex.size() != 32) return false;
  unsigned char bytes[16];
  for (size_t w = 0; w < hex.size() / 8; ++w) {
    uint32_t word = static_cast<uint32_t>(std::strtoul(hex.substr(w * 8, 8).c_str(), nullptr, 16));
    std::memcpy(bytes + w * 4, &word, 4);  // host order, as the kernel wrote it
  }
  char buf[INET6_ADDRSTRLEN] = "?";
  bool v6 = hex.size() == 32;
  ::inet_ntop(v6 ? AF_INET6 : AF_INET, bytes, buf, sizeof buf);
  *address = v6 ? "[" + std::string(buf) + "]" : std::string(buf);
  return true;
}

/// An address as ParseProcAddress writes it, with an IPv4-mapped IPv6 address as its IPv4 one (a dual-stack
/// server's accepted socket is in tcp6 as ::ffff:127.0.0.1 while our IPv4 client is in tcp).
std::string Unmapped(const std::string& address) {
  const std::string mapped = "[::ffff:";
  if (address.rfind(mapped, 0) == 0 && address.find('.') != std::string::npos)
    return address.substr(mapped.size(), address.size() - mapped.size() - 1);
  return address;
}

/// A sockaddr as ParseProcAddress writes its address part ("127.0.0.1", "[::1]"), unmapped, and its port.
bool SockaddrText(const sockaddr_storage& ss, std::string* address, int* port) {
  char buf[INET6_ADDRSTRLEN] = "";
  if (ss.ss_family == AF_INET) {
    const auto* a = reinterpret_cast<const sockaddr_in*>(&ss);
    ::inet_ntop(AF_INET, &a->sin_addr, buf, sizeof buf);
    *address = buf;
    *port = ntohs(a->sin_port);
    return true;
  }
  if (ss.ss_family == AF_INET6) {
    const auto* a = reinterpret_cast<const sockaddr_in6*>(&ss);
    ::inet_ntop(AF_INET6, &a->sin6_addr, buf, sizeof buf);
    *address = Unmapped("[" + std::string(buf) + "]");
    *port = ntohs(a->sin6_port);
    return true;
  }
  return false;
}

/// One row of /proc/net/tcp{,6}: addresses as ParseProcAddress writes them (an IPv4-mapped one not unmapped).
struct TcpRow {
  std::string local, remote, state;
  int local_port = 0, remote_port = 0;
  uid_t uid = 0;
  ino_t inode = 0;
};

/// Calls `each(row)` for every row of the table at `path`; stops when it returns true.
template <typename F>
void ForEachRow(const std::string& path, F each) {
  std::string text, err;
  if (!ReadFile(path, &text, &err)) return;
  std::istringstream lines(text);
  std::string line;
  std::getline(lines, line);  // the header
  while (std::getline(lines, line)) {
    // sl local rem st tx:rx tr:when retrnsmt uid timeout inode ...
    std::istringstream f(line);
    std::string sl, local, remote, queues, timer, retr;
    unsigned long uid = 0, timeout = 0, inode = 0;
    TcpRow r;
    if (!(f >> sl >> local >> remote >> r.state >> queues >> timer >> retr >> uid >> timeout >> inode)) continue;
    if (!ParseProcAddress(local, &r.local, &r.local_port) || !ParseProcAddress(remote, &r.remote, &r.remote_port))
      continue;
    r.uid = static_cast<uid_t>(uid);
    r.inode = static_cast<ino_t>(inode);
    if (each(r)) return;
  }
}

void ReadTable(const std::string& path, int port, std::vector<TcpListener>* out) {
  ForEachRow(path, [&](const TcpRow& r) {
    if (r.state == kListen && r.local_port == port)
      out->push_back(TcpListener{r.local + ":" + std::to_string(port), r.uid, r.inode});
    return false;
  });
}

/// Calls `each(inode)` for every socket among `pid`'s fds; stops when it returns true.
template <typename F>
bool ForEachSocket(pid_t pid, F each) {
  std::string dir = "/proc/" + std::to_string(pid) + "/fd";
  std::unique_ptr<DIR, int (*)(DIR*)> d(::opendir(dir.c_str()), ::closedir);
  if (!d) return false;
  char target[64];
  while (struct dirent* e = ::readdir(d.get())) {
    if (e->d_name[0] == '.') continue;
    ssize_t n = ::readlink((dir + "/" + e->d_name).c_str(), target, sizeof target - 1);
    if (n <= 8) continue;
    target[n] = '\0';
    if (std::strncmp(target, "socket:[", 8) != 0) continue;
    if (each(static_cast<ino_t>(std::strtoull(target + 8, nullptr, 10)))) return true;
  }
  return false;
}

}  // namespace

bool ListTcpListeners(int port, std::vector<TcpListener>* out, std::string* err) {
  out->clear();
  bool any = false;
  for (const char* path : {"/proc/net/tcp", "/proc/net/tcp6"}) {
    if (::access(path, R_OK) != 0) continue;
    any = true;
    ReadTable(path, port, out);
  }
  if (!any) *err = "cannot read /proc/net/tcp or /proc/net/tcp6";
  return any;
}

pid_t FindSocketHolder(ino_t inode) {
  for (const ProcStat& s : AllProcesses())
    if (ForEachSocket(s.pid, [&](ino_t i) { return i == inode; })) return s.pid;
  return -1;
}

PeerProof ProvePeer(int fd, pid_t root, std::string* who) {
  sockaddr_storage mine{}, theirs{};
  socklen_t l1 = sizeof mine, l2 = sizeof theirs;
  std::string my_addr, their_addr;
  int my_port = 0, their_port = 0;
  if (::getsockname(fd, reinterpret_cast<sockaddr*>(&mine), &l1) != 0 ||
      ::getpeername(fd, reinterpret_cast<sockaddr*>(&theirs), &l2) != 0 ||
      !SockaddrText(mine, &my_addr, &my_port) || !SockaddrText(theirs, &their_addr, &their_port))
    return PeerProof::kPending;
  TcpRow far;
  bool found = false;
  for (const char* path : {"/proc/net/tcp", "/proc/net/tcp6"}) {
    ForEachRow(path, [&](const TcpRow& r) {
      found = Unmapped(r.local) == their_addr && r.local_port == their_port && Unmapped(r.remote) == my_addr &&
              r.remote_port == my_port;
      if (found) far = r;
      return found;
    });
    if (found) break;
  }
  if (!found || far.inode == 0) return PeerProof::kPending;
  for (pid_t p : ProcessTree(root))
    if (ForEachSocket(p, [&](ino_t i) { return i == far.inode; })) return PeerProof::kOurs;
  pid_t holder = FindSocketHolder(far.inode);
  *who = "uid " + std::to_string(far.uid) + " (" + UserNameOf(far.uid) + ")" +
         (holder > 0 ? ", pid " + std::to_string(holder) + " (" + ProcessName(holder) + ")" : "") +
         ", its socket on " + their_addr + ":" + std::to_string(their_port);
  return PeerProof::kForeign;
}

ListenerProof ProveListener(int port, pid_t root, std::string* who, std::string* err) {
  std::vector<TcpListener> listeners;
  if (!ListTcpListeners(port, &listeners, err) || listeners.empty()) return ListenerProof::kNone;
  std::set<ino_t> ours;
  for (pid_t p : ProcessTree(root))
    ForEachSocket(p, [&](ino_t i) {
      ours.insert(i);
      return false;
    });
  for (const TcpListener& l : listeners) {
    if (l.inode != 0 && ours.count(l.inode)) continue;
    pid_t holder = l.inode != 0 ? FindSocketHolder(l.inode) : -1;
    *who = "uid " + std::to_string(l.uid) + " (" + UserNameOf(l.uid) + ")" +
           (holder > 0 ? ", pid " + std::to_string(holder) + " (" + ProcessName(holder) + ")" : "") +
           ", listening on " + l.address;
    return ListenerProof::kForeign;
  }
  return ListenerProof::kOurs;
}

}  // namespace dflash
