#include "common/listener_owner.h"

#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/fd.h"
#include "common/proc_scan.h"
#include "testing/process.h"

namespace dflash {
namespace {

/// A child that listens on 127.0.0.1 (a free port, or `want`) and waits to be killed: a real server of its own tree.
pid_t ListeningChild(int* port, int want = 0) {
  int fds[2];
  if (::pipe(fds) != 0) return -1;
  pid_t pid = ::fork();
  if (pid == 0) {
    int s = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    a.sin_port = htons(static_cast<uint16_t>(want));
    socklen_t len = sizeof a;
    int p = -1;
    if (::bind(s, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0 && ::listen(s, 4) == 0 &&
        ::getsockname(s, reinterpret_cast<sockaddr*>(&a), &len) == 0)
      p = ntohs(a.sin_port);
    (void)!::write(fds[1], &p, sizeof p);
    for (;;) ::pause();
  }
  ::close(fds[1]);
  *port = -1;
  (void)!::read(fds[0], port, sizeof *port);
  ::close(fds[0]);
  return pid;
}

/// A child that listens on 127.0.0.1 (a free port), accepts one connection and keeps it open until killed.
pid_t AcceptingChild(int* port) {
  int fds[2];
  if (::pipe(fds) != 0) return -1;
  pid_t pid = ::fork();
  if (pid == 0) {
    int s = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof a;
    int p = -1;
    if (::bind(s, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0 && ::listen(s, 4) == 0 &&
        ::getsockname(s, reinterpret_cast<sockaddr*>(&a), &len) == 0)
      p = ntohs(a.sin_port);
    (void)!::write(fds[1], &p, sizeof p);
    int c = ::accept(s, nullptr, nullptr);
    ::close(s);  // the port let go: only the accepted connection is left
    (void)c;
    for (;;) ::pause();
  }
  ::close(fds[1]);
  *port = -1;
  (void)!::read(fds[0], port, sizeof *port);
  ::close(fds[0]);
  return pid;
}

int ConnectTo(int port) {
  int c = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = htons(static_cast<uint16_t>(port));
  if (::connect(c, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
    ::close(c);
    return -1;
  }
  return c;
}

struct Reaped {
  pid_t pid;
  ~Reaped() {
    if (pid > 0) {
      ::kill(pid, SIGKILL);
      ::waitpid(pid, nullptr, 0);
    }
  }
};

TEST(ListenerOwner, ListsTheListenerWithItsOwnerAndAddress) {
  int port = 0;
  Reaped server{ListeningChild(&port)};
  ASSERT_GT(port, 0);
  std::vector<TcpListener> ls;
  std::string err;
  ASSERT_TRUE(ListTcpListeners(port, &ls, &err)) << err;
  ASSERT_EQ(ls.size(), 1u);
  EXPECT_EQ(ls[0].address, "127.0.0.1:" + std::to_string(port));
  EXPECT_EQ(ls[0].uid, ::geteuid());
  EXPECT_NE(ls[0].inode, 0u);
  EXPECT_EQ(FindSocketHolder(ls[0].inode), server.pid);
}

TEST(ListenerOwner, AServerOfTheTreeIsOursAndOfAnotherTreeIsForeignAndNamed) {
  int port = 0;
  Reaped server{ListeningChild(&port)};
  ASSERT_GT(port, 0);
  Reaped other{test::StartHelper({"sleep", "60"})};
  std::string who, err;
  // Our test process is the server's parent: the server is in our tree.
  EXPECT_EQ(ProveListener(port, ::getpid(), &who, &err), ListenerProof::kOurs) << who << err;
  EXPECT_EQ(ProveListener(port, server.pid, &who, &err), ListenerProof::kOurs) << who << err;
  // Not in the tree of `sleep`: the squatter is named by uid, pid and command.
  EXPECT_EQ(ProveListener(port, other.pid, &who, &err), ListenerProof::kForeign);
  EXPECT_NE(who.find("pid " + std::to_string(server.pid) + " ("), std::string::npos) << who;
  EXPECT_NE(who.find("uid " + std::to_string(::geteuid())), std::string::npos) << who;
  EXPECT_NE(who.find("127.0.0.1:" + std::to_string(port)), std::string::npos) << who;
}

TEST(ListenerOwner, NothingListeningIsNoneAndAnEndedServerLeavesNone) {
  int port = 0;
  pid_t pid = ListeningChild(&port);
  ASSERT_GT(port, 0);
  ::kill(pid, SIGKILL);
  ::waitpid(pid, nullptr, 0);
  std::string who, err;
  EXPECT_EQ(ProveListener(port, ::getpid(), &who, &err), ListenerProof::kNone) << who;
}

// Issue #46 item 2: who accepted a connection is known from the connection itself, even once the listener is gone.
TEST(ListenerOwner, ThePeerOfAConnectionIsWhoAcceptedIt) {
  int port = 0;
  Reaped server{AcceptingChild(&port)};
  ASSERT_GT(port, 0);
  Reaped other{test::StartHelper({"sleep", "60"})};
  UniqueFd c(ConnectTo(port));
  ASSERT_TRUE(c);
  std::string who;
  PeerProof got = PeerProof::kPending;
  for (int i = 0; i < 500 && got == PeerProof::kPending; ++i) {  // until the child has accepted it
    got = ProvePeer(c.get(), server.pid, &who);
    if (got == PeerProof::kPending) ::usleep(10 * 1000);
  }
  EXPECT_EQ(got, PeerProof::kOurs) << who;
  EXPECT_EQ(ProvePeer(c.get(), ::getpid(), &who), PeerProof::kOurs) << who;  // the child is in our tree
  // Seen from another tree (the role's, when a squatter accepted its probe): foreign, naming who holds it.
  ASSERT_EQ(ProvePeer(c.get(), other.pid, &who), PeerProof::kForeign);
  EXPECT_NE(who.find("pid " + std::to_string(server.pid) + " ("), std::string::npos) << who;
  EXPECT_NE(who.find("127.0.0.1:" + std::to_string(port)), std::string::npos) << who;
}

TEST(ListenerOwner, AConnectionNotYetAcceptedIsPending) {
  int port = 0;
  Reaped server{ListeningChild(&port)};  // listens, never accepts
  ASSERT_GT(port, 0);
  UniqueFd c(ConnectTo(port));
  ASSERT_TRUE(c);
  std::string who;
  EXPECT_EQ(ProvePeer(c.get(), server.pid, &who), PeerProof::kPending) << who;
  int unconnected = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  EXPECT_EQ(ProvePeer(unconnected, server.pid, &who), PeerProof::kPending);
  ::close(unconnected);
}

TEST(ListenerOwner, ADescendantOfTheRootIsInItsTree) {
  pid_t sh = test::StartHelper({"sh", "-c", "sleep 60 & wait"});
  Reaped r{sh};
  pid_t grandchild = -1;
  for (int i = 0; i < 500 && grandchild < 0; ++i) {
    for (pid_t p : ProcessTree(sh))
      if (p != sh) grandchild = p;
    if (grandchild < 0) ::usleep(10 * 1000);
  }
  ASSERT_GT(grandchild, 0);
  EXPECT_TRUE(InProcessTree(grandchild, sh));
  EXPECT_FALSE(InProcessTree(::getpid(), sh));
  EXPECT_FALSE(InProcessTree(-1, sh));
  ::kill(grandchild, SIGKILL);
}

}  // namespace
}  // namespace dflash
