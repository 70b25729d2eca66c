#include "common/notify.h"

#include <sys/random.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace dflash {
namespace {

/// NOTIFY_SOCKET syntax -> sockaddr_un. "@x" is abstract: sun_path[0] = 0,
/// and the length counts only the name's bytes (no trailing NUL).
bool ParseAddress(std::string_view address, sockaddr_un* sa, socklen_t* len, std::string* err) {
  std::memset(sa, 0, sizeof *sa);
  sa->sun_family = AF_UNIX;
  if (address.empty() || (address[0] != '/' && address[0] != '@')) {
    if (err) *err = "notify socket address must be a path or @abstract: '" + std::string(address) + "'";
    return false;
  }
  if (address.size() >= sizeof sa->sun_path) {
    if (err) *err = "notify socket address too long: '" + std::string(address) + "'";
    return false;
  }
  std::memcpy(sa->sun_path, address.data(), address.size());
  if (address[0] == '@') {
    sa->sun_path[0] = '\0';
    *len = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + address.size());
  } else {
    *len = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + address.size() + 1);
  }
  return true;
}

std::atomic<unsigned> g_listener_counter{0};

/// Linux's SCM_MAX_FD: the most fds one datagram can carry.
constexpr size_t kMaxFdsPerMessage = 253;
/// systemd accepts notification datagrams up to this size.
constexpr size_t kMaxDatagram = 4096;

}  // namespace

std::vector<std::pair<std::string, std::string>> ParseNotifyFields(std::string_view text) {
  std::vector<std::pair<std::string, std::string>> out;
  while (!text.empty()) {
    size_t nl = text.find('\n');
    std::string_view line = text.substr(0, nl);
    text = nl == std::string_view::npos ? std::string_view() : text.substr(nl + 1);
    size_t eq = line.find('=');
    if (eq == std::string_view::npos || eq == 0) continue;
    out.emplace_back(std::string(line.substr(0, eq)), std::string(line.substr(eq + 1)));
  }
  return out;
}

std::optional<std::string> NotifyMessage::Get(std::string_view key) const {
  std::optional<std::string> v;
  for (const auto& [k, val] : fields)
    if (k == key) v = val;
  return v;
}

bool NotifyMessage::Has(std::string_view key, std::string_view value) const {
  for (const auto& [k, val] : fields)
    if (k == key && val == value) return true;
  return false;
}

bool NotifySendTo(std::string_view address, std::string_view message, std::string* err) {
  sockaddr_un sa;
  socklen_t len;
  if (!ParseAddress(address, &sa, &len, err)) return false;
  UniqueFd fd(::socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0));
  if (!fd) {
    if (err) *err = ErrnoMessage("socket(AF_UNIX)", errno);
    return false;
  }
  for (;;) {
    ssize_t n = ::sendto(fd.get(), message.data(), message.size(), MSG_NOSIGNAL,
                         reinterpret_cast<sockaddr*>(&sa), len);
    if (n >= 0) return true;
    if (errno == EINTR) continue;
    if (err) *err = ErrnoMessage("sendto(" + std::string(address) + ")", errno);
    return false;
  }
}

bool NotifySend(std::string_view message, std::string* err) {
  const char* addr = std::getenv("NOTIFY_SOCKET");
  if (addr == nullptr || *addr == '\0') return true;
  return NotifySendTo(addr, message, err);
}

NotifyListener::~NotifyListener() {
  fd_.reset();
  if (!unlink_path_.empty()) ::unlink(unlink_path_.c_str());
}

bool NotifyListener::Open(std::string* err) {
  uint64_t rnd = 0;
  if (::getrandom(&rnd, sizeof rnd, GRND_NONBLOCK) != static_cast<ssize_t>(sizeof rnd))
    rnd = static_cast<uint64_t>(::getpid()) * 0x9e3779b97f4a7c15ULL ^ reinterpret_cast<uintptr_t>(this);
  char buf[96];
  std::snprintf(buf, sizeof buf, "@dflash/%d/%u/%016llx", static_cast<int>(::getpid()),
                g_listener_counter.fetch_add(1), static_cast<unsigned long long>(rnd));
  return Open(buf, err);
}

bool NotifyListener::Open(std::string_view address, std::string* err) {
  sockaddr_un sa;
  socklen_t len;
  if (!ParseAddress(address, &sa, &len, err)) return false;
  UniqueFd fd(::socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
  if (!fd) {
    if (err) *err = ErrnoMessage("socket(AF_UNIX)", errno);
    return false;
  }
  // Set before bind so no datagram can arrive without credentials.
  int one = 1;
  if (::setsockopt(fd.get(), SOL_SOCKET, SO_PASSCRED, &one, sizeof one) != 0) {
    if (err) *err = ErrnoMessage("setsockopt(SO_PASSCRED)", errno);
    return false;
  }
  if (::bind(fd.get(), reinterpret_cast<sockaddr*>(&sa), len) != 0) {
    if (err) *err = ErrnoMessage("bind(" + std::string(address) + ")", errno);
    return false;
  }
  fd_ = std::move(fd);
  address_ = std::string(address);
  if (address[0] == '/') unlink_path_ = address_;
  return true;
}

bool NotifyListener::Receive(std::vector<NotifyMessage>* out, std::string* err) {
  // Room for the credentials and a full SCM_RIGHTS array, so a sender cannot
  // make the fds we must close disappear into MSG_CTRUNC.
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(ucred)) + CMSG_SPACE(sizeof(int) * kMaxFdsPerMessage)];
  char data[kMaxDatagram + 1];
  for (;;) {
    iovec iov{data, sizeof data};
    msghdr msg{};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control;
    msg.msg_controllen = sizeof control;
    // MSG_CMSG_CLOEXEC: a received fd must not leak into a concurrent fork.
    ssize_t n = ::recvmsg(fd_.get(), &msg, MSG_DONTWAIT | MSG_CMSG_CLOEXEC | MSG_TRUNC);
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) return true;
      if (err) *err = ErrnoMessage("recvmsg(notify socket)", errno);
      return false;
    }

    const ucred* cred = nullptr;
    for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c != nullptr; c = CMSG_NXTHDR(&msg, c)) {
      if (c->cmsg_level != SOL_SOCKET) continue;
      if (c->cmsg_type == SCM_RIGHTS) {
        size_t nfds = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
        for (size_t i = 0; i < nfds; ++i) {
          int fd;
          std::memcpy(&fd, CMSG_DATA(c) + i * sizeof(int), sizeof fd);
          ::close(fd);
          ++stats_.fds_closed;
        }
      } else if (c->cmsg_type == SCM_CREDENTIALS && c->cmsg_len >= CMSG_LEN(sizeof(ucred))) {
        cred = reinterpret_cast<const ucred*>(CMSG_DATA(c));
      }
    }
    if ((msg.msg_flags & (MSG_TRUNC | MSG_CTRUNC)) != 0 || static_cast<size_t>(n) > kMaxDatagram) {
      ++stats_.truncated;
      continue;
    }
    if (cred == nullptr) {
      ++stats_.no_credentials;
      continue;
    }
    if (cred->uid != ::getuid() && cred->uid != ::geteuid()) {
      ++stats_.foreign_uid;
      continue;
    }
    NotifyMessage m;
    m.pid = cred->pid;
    m.uid = cred->uid;
    m.gid = cred->gid;
    m.pgid = ::getpgid(cred->pid);
    m.fields = ParseNotifyFields(std::string_view(data, static_cast<size_t>(n)));
    ++stats_.received;
    out->push_back(std::move(m));
  }
}

}  // namespace dflash
