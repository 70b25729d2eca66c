// NetProbe against real sockets of this process: a listener and a thread that
// plays the server (answers, garbage, a huge first line, silence, a refusal).
#include "common/net_probe.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <functional>
#include <atomic>
#include <thread>

#include <gtest/gtest.h>

#include "contract/probe_spec.h"

namespace dflash {
namespace {

/// A listener on 127.0.0.1 (or ::1) on a free port.
struct Listener {
  UniqueFd fd;
  int port = 0;
  bool Open(bool v6 = false) {
    fd.reset(::socket(v6 ? AF_INET6 : AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
    if (!fd) return false;
    sockaddr_storage ss{};
    socklen_t len;
    if (v6) {
      auto* a = reinterpret_cast<sockaddr_in6*>(&ss);
      a->sin6_family = AF_INET6;
      a->sin6_addr = in6addr_loopback;
      len = sizeof *a;
    } else {
      auto* a = reinterpret_cast<sockaddr_in*>(&ss);
      a->sin_family = AF_INET;
      a->sin_addr.s_addr = htonl(INADDR_LOOPBACK);
      len = sizeof *a;
    }
    if (::bind(fd.get(), reinterpret_cast<sockaddr*>(&ss), len) != 0 || ::listen(fd.get(), 4) != 0) return false;
    ::getsockname(fd.get(), reinterpret_cast<sockaddr*>(&ss), &len);
    port = ntohs(v6 ? reinterpret_cast<sockaddr_in6*>(&ss)->sin6_port : reinterpret_cast<sockaddr_in*>(&ss)->sin_port);
    return true;
  }
};

/// Drives `p` with poll until it is done or `limit` passed (the caller's probe_timeout).
void Drive(NetProbe* p, std::chrono::milliseconds limit) {
  auto end = std::chrono::steady_clock::now() + limit;
  while (!p->done() && std::chrono::steady_clock::now() < end) {
    pollfd pfd{p->fd(), static_cast<short>(p->events() & 0xffff), 0};
    if (::poll(&pfd, 1, 20) > 0) p->OnReady();
  }
}

/// A server that accepts one connection, reads the request and runs `serve`.
std::thread Serve(Listener* l, std::function<void(int, const std::string&)> serve) {
  return std::thread([l, serve] {
    int c = ::accept(l->fd.get(), nullptr, nullptr);
    if (c < 0) return;
    std::string req;
    char buf[512];
    while (req.find("\r\n\r\n") == std::string::npos) {
      ssize_t n = ::read(c, buf, sizeof buf);
      if (n <= 0) break;
      req.append(buf, static_cast<size_t>(n));
    }
    serve(c, req);
    ::close(c);
  });
}

void Send(int fd, const std::string& s) { ASSERT_EQ(::write(fd, s.data(), s.size()), static_cast<ssize_t>(s.size())); }

ProbeSpec Http(int port, const std::string& path = "/health") {
  ProbeSpec p;
  std::string err;
  EXPECT_TRUE(ParseProbeUrl("http://127.0.0.1:" + std::to_string(port) + path, &p, &err)) << err;
  return p;
}

std::string Judge(const ProbeSpec& spec, const NetProbe& p, bool* answered) {
  std::string detail;
  *answered = JudgeProbe(spec, p.connected(), p.reply(), p.complete(), p.error(), &detail);
  return detail;
}

TEST(NetProbe, RefusedPortEndsTheTryWithItsReason) {
  Listener l;
  ASSERT_TRUE(l.Open());
  int port = l.port;
  l.fd.reset();  // nobody listens there now
  NetProbe p;
  p.Start("127.0.0.1", port, "", 0);
  Drive(&p, std::chrono::seconds(5));
  ASSERT_TRUE(p.done());
  EXPECT_FALSE(p.connected());
  EXPECT_EQ(p.error(), "connection refused");
  EXPECT_LT(p.fd(), 0) << "nothing to wait on once done";
}

TEST(NetProbe, TcpConnectIsTheAnswer) {
  Listener l;
  ASSERT_TRUE(l.Open());
  NetProbe p;
  p.Start("127.0.0.1", l.port, "", 0);
  Drive(&p, std::chrono::seconds(5));
  ASSERT_TRUE(p.done());
  EXPECT_TRUE(p.connected());
  EXPECT_EQ(p.error(), "");
}

TEST(NetProbe, HttpReadsTheStatusLineOfTheAnswer) {
  Listener l;
  ASSERT_TRUE(l.Open());
  std::string seen;
  std::thread t = Serve(&l, [&](int c, const std::string& req) {
    seen = req;
    Send(c, "HTTP/1.0 200 OK\r\nContent-Type: text/plain\r\n\r\nok");
  });
  ProbeSpec spec = Http(l.port);
  NetProbe p;
  p.Start(spec.host, spec.port, spec.Request(), kMaxStatusLine);
  Drive(&p, std::chrono::seconds(5));
  t.join();
  ASSERT_TRUE(p.done());
  bool answered = false;
  EXPECT_EQ(Judge(spec, p, &answered), "HTTP 200");
  EXPECT_TRUE(answered);
  EXPECT_EQ(seen.rfind("GET /health HTTP/1.0\r\nHost: 127.0.0.1:" + std::to_string(l.port) + "\r\n", 0), 0u) << seen;
}

TEST(NetProbe, GarbageIsNoAnswer) {
  Listener l;
  ASSERT_TRUE(l.Open());
  std::thread t = Serve(&l, [](int c, const std::string&) { Send(c, std::string("\x16\x03\x01\x02\x00garbage", 12)); });
  ProbeSpec spec = Http(l.port);
  NetProbe p;
  p.Start(spec.host, spec.port, spec.Request(), kMaxStatusLine);
  Drive(&p, std::chrono::seconds(5));
  t.join();
  ASSERT_TRUE(p.done());
  bool answered = true;
  std::string detail = Judge(spec, p, &answered);
  EXPECT_FALSE(answered);
  EXPECT_NE(detail.find("not an HTTP status line: '\\x16\\x03\\x01\\x02\\x00garbage'"), std::string::npos) << detail;
}

TEST(NetProbe, AHugeFirstLineIsReadOnlyUpToTheBound) {
  Listener l;
  ASSERT_TRUE(l.Open());
  std::atomic<bool> stop{false};
  std::thread t = Serve(&l, [&](int c, const std::string&) {
    std::string chunk(64 * 1024, 'A');
    ::send(c, chunk.data(), chunk.size(), MSG_NOSIGNAL);  // and keeps the connection open
    while (!stop) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  });
  ProbeSpec spec = Http(l.port);
  NetProbe p;
  p.Start(spec.host, spec.port, spec.Request(), kMaxStatusLine);
  Drive(&p, std::chrono::seconds(5));
  stop = true;
  t.join();
  ASSERT_TRUE(p.done());
  EXPECT_EQ(p.reply().size(), kMaxStatusLine);
  bool answered = true;
  std::string detail = Judge(spec, p, &answered);
  EXPECT_FALSE(answered);
  EXPECT_NE(detail.find("no status line within 1024 bytes"), std::string::npos) << detail;
}

TEST(NetProbe, AServerThatAcceptsAndNeverAnswersLeavesTheTryOpenForItsDeadline) {
  Listener l;
  ASSERT_TRUE(l.Open());
  std::atomic<bool> stop{false};
  std::thread t = Serve(&l, [&](int, const std::string&) {
    while (!stop) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  });
  ProbeSpec spec = Http(l.port);
  NetProbe p;
  p.Start(spec.host, spec.port, spec.Request(), kMaxStatusLine);
  Drive(&p, std::chrono::milliseconds(300));
  // Connected and sent, still waiting: only the caller's deadline ends it
  // (ProbeRunner::Expire: "no answer within 1s"); no call blocked meanwhile.
  EXPECT_FALSE(p.done());
  EXPECT_TRUE(p.connected());
  EXPECT_GE(p.fd(), 0);
  stop = true;
  t.join();  // the server closes: EOF with nothing said
  Drive(&p, std::chrono::seconds(5));
  ASSERT_TRUE(p.done());
  bool answered = true;
  EXPECT_EQ(Judge(spec, p, &answered), "the server closed the connection without answering");
  EXPECT_FALSE(answered);
}

// Issue #46 item 2: the request waits until the caller has proven who accepted the connection.
TEST(NetProbe, AHeldRequestIsSentOnlyOnceReleased) {
  Listener l;
  ASSERT_TRUE(l.Open());
  std::atomic<bool> got_early{false};
  std::thread t([&] {
    int c = ::accept(l.fd.get(), nullptr, nullptr);
    if (c < 0) return;
    pollfd pfd{c, POLLIN, 0};
    got_early = ::poll(&pfd, 1, 300) > 0;  // nothing may come while the request is held
    std::string req;
    char buf[512];
    while (req.find("\r\n\r\n") == std::string::npos) {
      ssize_t n = ::read(c, buf, sizeof buf);
      if (n <= 0) break;
      req.append(buf, static_cast<size_t>(n));
    }
    Send(c, "HTTP/1.1 200 OK\r\n\r\n");
    ::close(c);
  });
  ProbeSpec spec = Http(l.port);
  NetProbe p;
  p.HoldRequest();
  p.Start(spec.host, spec.port, spec.Request(), kMaxStatusLine);
  Drive(&p, std::chrono::milliseconds(200));
  EXPECT_TRUE(p.connected());
  EXPECT_TRUE(p.held());
  EXPECT_FALSE(p.done());
  EXPECT_EQ(p.events(), 0u);
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  p.Release();
  Drive(&p, std::chrono::seconds(5));
  t.join();
  EXPECT_FALSE(got_early);
  ASSERT_TRUE(p.done());
  bool answered = false;
  Judge(spec, p, &answered);
  EXPECT_TRUE(answered) << p.error() << p.reply();
}

TEST(NetProbe, Ipv6Loopback) {
  Listener l;
  if (!l.Open(/*v6=*/true)) GTEST_SKIP() << "no IPv6 loopback here";
  NetProbe p;
  p.Start("::1", l.port, "", 0);
  Drive(&p, std::chrono::seconds(5));
  ASSERT_TRUE(p.done());
  EXPECT_TRUE(p.connected()) << p.error();
}

TEST(NetProbe, NotAnAddressFailsAtOnce) {
  NetProbe p;
  EXPECT_FALSE(p.Start("localhost", 80, "", 0));  // names are resolved before, never here
  EXPECT_TRUE(p.done());
  EXPECT_NE(p.error().find("not an IP address"), std::string::npos);
}

}  // namespace
}  // namespace dflash
