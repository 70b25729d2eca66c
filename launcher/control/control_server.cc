#include "launcher/control/control_server.h"

#include <fcntl.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>

#include "launcher/control/control_wire.h"

namespace dflash {
namespace {

constexpr const char* kSocketName = "control.sock";

/// A path to `name` in the directory `dirfd` that fits sockaddr_un whatever the
/// run dir's length (108 bytes): the kernel resolves /proc/self/fd/N to the
/// directory itself, so it is also immune to the run dir's path being swapped.
std::string PathVia(int dirfd, const std::string& name) {
  return "/proc/self/fd/" + std::to_string(dirfd) + "/" + name;
}

bool FillAddress(const std::string& path, sockaddr_un* addr, socklen_t* len) {
  std::memset(addr, 0, sizeof *addr);
  addr->sun_family = AF_UNIX;
  if (path.size() >= sizeof addr->sun_path) return false;
  std::memcpy(addr->sun_path, path.c_str(), path.size() + 1);
  *len = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + path.size() + 1);
  return true;
}

std::string Mode(mode_t m) {
  char buf[8];
  std::snprintf(buf, sizeof buf, "%04o", static_cast<unsigned>(m & 07777));
  return buf;
}

}  // namespace

ControlServer::~ControlServer() { Close(); }

bool ControlServer::Open(const std::string& run_dir, std::string* err) {
  Close();
  path_ = run_dir + "/" + kSocketName;
  dir_.reset(::open(run_dir.c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC));
  if (!dir_) {
    *err = ErrnoMessage("open(" + run_dir + ")", errno);
    return false;
  }
  struct stat dst;
  if (::fstat(dir_.get(), &dst) != 0) {
    *err = ErrnoMessage("stat(" + run_dir + ")", errno);
    return false;
  }
  // Whoever may write the directory may put their own socket in our socket's
  // place between two of our calls, or after: refuse rather than hope.
  if (dst.st_uid != ::geteuid() || (dst.st_mode & 022) != 0) {
    *err = "run dir " + run_dir + " (owner uid " + std::to_string(dst.st_uid) + ", mode " + Mode(dst.st_mode) +
           ") is not only ours to write: no control socket (chmod go-w " + run_dir + ")";
    return false;
  }
  epoll_.reset(::epoll_create1(EPOLL_CLOEXEC));
  listener_.reset(::socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
  if (!epoll_ || !listener_) {
    *err = ErrnoMessage(!epoll_ ? "epoll_create1" : "socket(AF_UNIX)", errno);
    Close();
    return false;
  }
  const std::string tmp = std::string(kSocketName) + "." + std::to_string(::getpid()) + ".tmp";
  ::unlinkat(dir_.get(), tmp.c_str(), 0);  // our own leftover (the dir is only ours)
  sockaddr_un addr;
  socklen_t len;
  if (!FillAddress(PathVia(dir_.get(), tmp), &addr, &len)) {
    *err = "socket path too long";
    Close();
    return false;
  }
  // The file is born 0600: the socket inode's mode (fchmod before bind) and the
  // umask both decide it on Linux; set both, so no moment exists when another
  // user could connect.
  ::fchmod(listener_.get(), 0600);
  mode_t old_umask = ::umask(0077);
  int rc = ::bind(listener_.get(), reinterpret_cast<sockaddr*>(&addr), len);
  int bind_errno = errno;
  ::umask(old_umask);
  if (rc != 0) {
    *err = ErrnoMessage("bind(" + run_dir + "/" + tmp + ")", bind_errno);
    Close();
    return false;
  }
  // rename(2) replaces whatever is at the path (a stale socket of an earlier
  // run with this id, a planted file or symlink) without following it.
  if (::renameat(dir_.get(), tmp.c_str(), dir_.get(), kSocketName) != 0) {
    *err = ErrnoMessage("rename to " + path_, errno);
    ::unlinkat(dir_.get(), tmp.c_str(), 0);
    Close();
    return false;
  }
  struct stat st;
  if (::fstatat(dir_.get(), kSocketName, &st, AT_SYMLINK_NOFOLLOW) != 0 || !S_ISSOCK(st.st_mode) ||
      st.st_uid != ::geteuid() || (st.st_mode & 077) != 0) {
    *err = path_ + " is not the 0600 socket just made";
    Close();
    return false;
  }
  dev_ = st.st_dev;
  ino_ = st.st_ino;
  if (::listen(listener_.get(), 16) != 0) {
    *err = ErrnoMessage("listen(" + path_ + ")", errno);
    Close();
    return false;
  }
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.fd = listener_.get();
  if (::epoll_ctl(epoll_.get(), EPOLL_CTL_ADD, listener_.get(), &ev) != 0) {
    *err = ErrnoMessage("epoll_ctl", errno);
    Close();
    return false;
  }
  return true;
}

void ControlServer::Close() {
  clients_.clear();
  listener_.reset();
  epoll_.reset();
  if (dir_ && ino_ != 0) {
    // Only our own socket: never a file someone put in its place.
    struct stat st;
    if (::fstatat(dir_.get(), kSocketName, &st, AT_SYMLINK_NOFOLLOW) == 0 && st.st_dev == dev_ &&
        st.st_ino == ino_)
      ::unlinkat(dir_.get(), kSocketName, 0);
  }
  ino_ = 0;
  dir_.reset();
}

void ControlServer::OnReadable(ControlHandler& handler) {
  if (!epoll_) return;
  epoll_event events[32];
  // Level-triggered: what is not served in this turn fires again in the next,
  // so one busy client cannot starve the loop.
  int n = ::epoll_wait(epoll_.get(), events, 32, 0);
  for (int i = 0; i < n; ++i) {
    int fd = events[i].data.fd;
    if (listener_ && fd == listener_.get()) {
      Accept();
      continue;
    }
    auto it = std::find_if(clients_.begin(), clients_.end(), [&](const Client& c) { return c.fd.get() == fd; });
    if (it == clients_.end()) continue;  // dropped earlier in this batch
    Serve(static_cast<size_t>(it - clients_.begin()), events[i].events, handler);
  }
  DropIdle();
}

void ControlServer::Accept() {
  for (int k = 0; k < 16; ++k) {  // a bounded batch per turn
    UniqueFd fd(::accept4(listener_.get(), nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC));
    if (!fd) return;  // EAGAIN, or the peer already went (ECONNABORTED)
    ucred cred{};
    socklen_t len = sizeof cred;
    if (::getsockopt(fd.get(), SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0 || cred.uid != ::geteuid()) {
      ControlReply r;
      r.error = "refused: uid " + std::to_string(cred.uid) + " is not the run's owner (uid " +
                std::to_string(::geteuid()) + ")";
      std::string line = EncodeReply(r);
      // Best effort into an empty socket buffer; it never blocks.
      [[maybe_unused]] ssize_t w = ::send(fd.get(), line.data(), line.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
      continue;
    }
    if (clients_.size() >= options_.max_clients) {
      auto oldest = std::min_element(clients_.begin(), clients_.end(), [](const Client& a, const Client& b) {
        return a.last_active < b.last_active;
      });
      Drop(static_cast<size_t>(oldest - clients_.begin()));
    }
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.fd = fd.get();
    if (::epoll_ctl(epoll_.get(), EPOLL_CTL_ADD, fd.get(), &ev) != 0) continue;
    Client c;
    c.fd = std::move(fd);
    c.last_active = std::chrono::steady_clock::now();
    clients_.push_back(std::move(c));
  }
}

bool ControlServer::Serve(size_t index, uint32_t events, ControlHandler& handler) {
  Client& c = clients_[index];
  c.last_active = std::chrono::steady_clock::now();
  if (events & EPOLLOUT) {
    if (!Flush(c)) {
      Drop(index);
      return false;
    }
  }
  if ((events & (EPOLLIN | EPOLLHUP | EPOLLERR)) && !c.closing) {
    char buf[4096];
    ssize_t r = ::read(c.fd.get(), buf, sizeof buf);
    if (r == 0 || (r < 0 && errno != EAGAIN && errno != EINTR)) {
      Drop(index);  // the client hung up (or the socket broke): nothing to answer
      return false;
    }
    if (r > 0) c.in.append(buf, static_cast<size_t>(r));
    size_t start = 0, nl;
    while (!c.closing && (nl = c.in.find('\n', start)) != std::string::npos) {
      std::string line = c.in.substr(start, nl - start);
      start = nl + 1;
      if (!line.empty() && line.back() == '\r') line.pop_back();
      if (line.empty()) continue;
      HandleLine(c, line, handler);
    }
    c.in.erase(0, start);
    if (!c.closing && c.in.size() > kMaxControlRequestBytes) {
      ControlReply r;
      r.error = "bad request: longer than " + std::to_string(kMaxControlRequestBytes) + " bytes";
      c.out += EncodeReply(r);
      c.in.clear();
      c.closing = true;
    }
    if (c.out.size() > options_.max_unsent_bytes || !Flush(c)) {
      Drop(index);
      return false;
    }
  } else if ((events & (EPOLLHUP | EPOLLERR)) && c.out.empty()) {
    Drop(index);
    return false;
  }
  if (c.closing && c.out.empty()) {
    Drop(index);
    return false;
  }
  return true;
}

void ControlServer::HandleLine(Client& c, const std::string& line, ControlHandler& handler) {
  ControlRequest req;
  ControlReply reply;
  std::string err;
  if (!DecodeRequest(line, &req, &err)) {
    reply.error = err;
  } else if (req.verb == ControlVerb::kStatus) {
    reply.ok = true;
    reply.body = ToJson(handler.Status());
  } else {
    reply = handler.Apply(req);
  }
  c.out += EncodeReply(reply);
}

bool ControlServer::Flush(Client& c) {
  while (!c.out.empty()) {
    ssize_t w = ::send(c.fd.get(), c.out.data(), c.out.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
    if (w < 0) {
      if (errno == EINTR) continue;
      if (errno != EAGAIN) return false;
      break;
    }
    c.out.erase(0, static_cast<size_t>(w));
  }
  // Wait for room only while something is left: a level-triggered EPOLLOUT on
  // an idle socket would wake the loop forever.
  // A closing client is not read any more: it must not wake us for input.
  uint32_t want = (c.closing ? 0u : static_cast<uint32_t>(EPOLLIN)) | (c.out.empty() ? 0u : EPOLLOUT);
  if (want != c.events) {
    epoll_event ev{};
    ev.events = want;
    ev.data.fd = c.fd.get();
    ::epoll_ctl(epoll_.get(), EPOLL_CTL_MOD, c.fd.get(), &ev);
    c.events = want;
  }
  return true;
}

void ControlServer::Drop(size_t index) {
  ::epoll_ctl(epoll_.get(), EPOLL_CTL_DEL, clients_[index].fd.get(), nullptr);
  clients_.erase(clients_.begin() + static_cast<std::ptrdiff_t>(index));
}

void ControlServer::DropIdle() {
  auto now = std::chrono::steady_clock::now();
  for (size_t i = clients_.size(); i-- > 0;)
    if (now - clients_[i].last_active > options_.idle_timeout) Drop(i);
}

}  // namespace dflash
