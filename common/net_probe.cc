#include "common/net_probe.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/epoll.h>
#include <sys/socket.h>

#include <cerrno>
#include <cstring>

namespace dflash {
namespace {

std::string SocketError(int e) {
  if (e == ECONNREFUSED) return "connection refused";
  if (e == ECONNRESET) return "connection reset";
  if (e == ETIMEDOUT) return "connect timed out";
  if (e == ENETUNREACH || e == EHOSTUNREACH) return "address unreachable";
  return std::strerror(e);
}

}  // namespace

bool NetProbe::Start(const std::string& host, int port, std::string request, size_t max_reply) {
  request_ = std::move(request);
  max_reply_ = max_reply;
  sockaddr_storage ss{};
  socklen_t len = 0;
  auto* v4 = reinterpret_cast<sockaddr_in*>(&ss);
  auto* v6 = reinterpret_cast<sockaddr_in6*>(&ss);
  if (::inet_pton(AF_INET, host.c_str(), &v4->sin_addr) == 1) {
    v4->sin_family = AF_INET;
    v4->sin_port = htons(static_cast<uint16_t>(port));
    len = sizeof *v4;
  } else if (::inet_pton(AF_INET6, host.c_str(), &v6->sin6_addr) == 1) {
    v6->sin6_family = AF_INET6;
    v6->sin6_port = htons(static_cast<uint16_t>(port));
    len = sizeof *v6;
  } else {
    Finish("'" + host + "' is not an IP address");
    return false;
  }
  fd_.reset(::socket(ss.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
  if (!fd_) {
    Finish(ErrnoMessage("socket", errno));
    return false;
  }
  if (::connect(fd_.get(), reinterpret_cast<sockaddr*>(&ss), len) == 0) {
    connected_ = true;
    if (request_.empty() && !hold_) Finish("");
    return !done_;
  }
  if (errno != EINPROGRESS) {
    Finish(SocketError(errno));
    return false;
  }
  return true;
}

uint32_t NetProbe::events() const {
  if (done_) return 0;
  if (held()) return 0;
  return !connected_ || sent_ < request_.size() ? EPOLLOUT : EPOLLIN;
}

bool NetProbe::OnReady() {
  if (done_) return true;
  if (held()) {
    int e = 0;
    socklen_t l = sizeof e;
    if (::getsockopt(fd_.get(), SOL_SOCKET, SO_ERROR, &e, &l) != 0) e = errno;
    // events() is 0 while held: only a hang-up or an error wakes it, so it ends here either way.
    Finish(e != 0 ? SocketError(e) : "the connection was closed before the request was sent");
    return true;
  }
  if (!connected_) {
    int e = 0;
    socklen_t l = sizeof e;
    if (::getsockopt(fd_.get(), SOL_SOCKET, SO_ERROR, &e, &l) != 0) e = errno;
    if (e == EINPROGRESS || e == EALREADY) return false;
    if (e != 0) {
      Finish(SocketError(e));
      return true;
    }
    connected_ = true;
    if (hold_) return false;
    if (request_.empty()) {
      Finish("");
      return true;
    }
  }
  while (sent_ < request_.size()) {
    // MSG_NOSIGNAL: a server that closed on us is an answer, not a SIGPIPE.
    ssize_t n = ::send(fd_.get(), request_.data() + sent_, request_.size() - sent_, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return false;
    if (n < 0) {
      Finish("sending the request: " + SocketError(errno));
      return true;
    }
    sent_ += static_cast<size_t>(n);
  }
  char buf[512];
  while (reply_.size() < max_reply_) {
    ssize_t n = ::recv(fd_.get(), buf, std::min(sizeof buf, max_reply_ - reply_.size()), 0);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return false;
    if (n < 0) {
      // A reset after a whole line still leaves that line to judge.
      if (reply_.find('\n') != std::string::npos) break;
      Finish("reading the answer: " + SocketError(errno));
      return true;
    }
    if (n == 0) {
      complete_ = true;  // EOF: what came is all there is
      break;
    }
    reply_.append(buf, static_cast<size_t>(n));
    if (reply_.find('\n') != std::string::npos) {
      complete_ = true;
      break;
    }
  }
  Finish("");
  return true;
}

void NetProbe::Finish(const std::string& error) {
  error_ = error;
  done_ = true;
}

}  // namespace dflash
