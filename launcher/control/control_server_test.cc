// The control socket over a real AF_UNIX socket, served by a loop thread as the
// supervisor serves it, with a fake ControlHandler.
#include "launcher/control/control_server.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <thread>

#include "launcher/control/control_client.h"
#include "launcher/control/control_wire.h"

namespace dflash {
namespace {

using namespace std::chrono_literals;

class FakeHandler : public ControlHandler {
 public:
  RunStatus Status() override {
    ++status_calls;
    RunStatus s;
    s.run_id = "r1";
    s.run_dir = "/x/r1";
    s.supervisor_pid = 4242;
    ProcessStatus p;
    p.name = "drafter:1";
    p.role = "drafter";
    p.rank = 1;
    p.state = "RUNNING";
    p.status = "step 7 loss 2.5";
    s.processes.push_back(p);
    return s;
  }
  ControlReply Apply(const ControlRequest& r) override {
    last_verb = r.verb;
    last_target = r.target;
    last_signal = r.signal;
    ControlReply reply;
    if (r.target == "nobody") {
      reply.error = "no role or process \"nobody\"";
    } else {
      reply.ok = true;
      reply.body = {{"affected", {r.target}}};
    }
    return reply;
  }
  std::atomic<int> status_calls{0};
  ControlVerb last_verb = ControlVerb::kStatus;
  std::string last_target;
  int last_signal = 0;
};

/// A temp run dir (0700) and a server served by a loop thread until the end.
class ControlServerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/ctl_test_XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override {
    Stop();
    std::filesystem::permissions(dir_, std::filesystem::perms::owner_all);
    std::filesystem::remove_all(dir_);
  }
  void Start(ControlServer::Options o = {}) {
    server_ = std::make_unique<ControlServer>(o);
    std::string err;
    ASSERT_TRUE(server_->Open(dir_, &err)) << err;
    loop_ = std::thread([this] {
      while (!stop_) {
        pollfd p{server_->fd(), POLLIN, 0};
        if (::poll(&p, 1, 20) > 0) server_->OnReadable(handler_);
        server_->DropIdle();
        clients_ = server_->clients();
      }
    });
  }
  void Stop() {
    stop_ = true;
    if (loop_.joinable()) loop_.join();
    server_.reset();
  }
  /// A raw connection, no checks: what a careless or hostile client does.
  UniqueFd Raw() {
    UniqueFd fd(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
    sockaddr_un a{};
    a.sun_family = AF_UNIX;
    std::string path = dir_ + "/control.sock";
    std::strcpy(a.sun_path, path.c_str());
    EXPECT_EQ(::connect(fd.get(), reinterpret_cast<sockaddr*>(&a), sizeof a), 0) << std::strerror(errno);
    return fd;
  }
  /// Reads one line, or "" on EOF, or "TIMEOUT".
  static std::string ReadLine(int fd, std::chrono::milliseconds timeout = 10s) {
    std::string in;
    auto deadline = std::chrono::steady_clock::now() + timeout;
    while (in.find('\n') == std::string::npos) {
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
      if (left.count() <= 0) return "TIMEOUT";
      pollfd p{fd, POLLIN, 0};
      if (::poll(&p, 1, static_cast<int>(left.count())) <= 0) continue;
      char buf[4096];
      ssize_t r = ::read(fd, buf, sizeof buf);
      if (r <= 0) return in;
      in.append(buf, static_cast<size_t>(r));
    }
    return in.substr(0, in.find('\n'));
  }
  /// True once `fd` reads EOF (the server dropped it) within the deadline.
  static bool ClosedByServer(int fd, std::chrono::milliseconds timeout = 10s) {
    auto deadline = std::chrono::steady_clock::now() + timeout;
    while (std::chrono::steady_clock::now() < deadline) {
      pollfd p{fd, POLLIN, 0};
      if (::poll(&p, 1, 50) <= 0) continue;
      char buf[4096];
      ssize_t r = ::read(fd, buf, sizeof buf);
      if (r == 0 || (r < 0 && errno == ECONNRESET)) return true;
    }
    return false;
  }
  ControlReply Call(const ControlRequest& req) {
    UniqueFd fd;
    std::string err;
    EXPECT_EQ(ConnectControl(dir_, &fd, &err), ConnectResult::kOk) << err;
    ControlReply reply;
    EXPECT_TRUE(CallControl(fd.get(), req, &reply, 10s, &err)) << err;
    return reply;
  }

  std::string dir_;
  FakeHandler handler_;
  std::unique_ptr<ControlServer> server_;
  std::thread loop_;
  std::atomic<bool> stop_{false};
  std::atomic<size_t> clients_{0};
};

TEST_F(ControlServerTest, StatusRoundTripsThroughTheSocket) {
  Start();
  struct stat st;
  ASSERT_EQ(::lstat((dir_ + "/control.sock").c_str(), &st), 0);
  EXPECT_TRUE(S_ISSOCK(st.st_mode));
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  ControlReply reply = Call(ControlRequest{});
  ASSERT_TRUE(reply.ok) << reply.error;
  RunStatus s;
  std::string err;
  ASSERT_TRUE(FromJson(reply.body, &s, &err)) << err;
  EXPECT_EQ(s.run_id, "r1");
  ASSERT_EQ(s.processes.size(), 1u);
  EXPECT_EQ(s.processes[0].status, "step 7 loss 2.5");
}

TEST_F(ControlServerTest, VerbsReachTheHandlerAndItsRefusalComesBack) {
  Start();
  ControlRequest req;
  req.verb = ControlVerb::kSignal;
  req.target = "drafter:1";
  req.signal = 10;
  ControlReply reply = Call(req);
  ASSERT_TRUE(reply.ok) << reply.error;
  EXPECT_EQ(reply.body["affected"][0], "drafter:1");
  Stop();  // the handler's fields are the loop thread's until then
  EXPECT_EQ(handler_.last_verb, ControlVerb::kSignal);
  EXPECT_EQ(handler_.last_signal, 10);
  stop_ = false;
  Start();
  req.verb = ControlVerb::kRestart;
  req.target = "nobody";
  reply = Call(req);
  EXPECT_FALSE(reply.ok);
  EXPECT_EQ(reply.error, "no role or process \"nobody\"");
}

TEST_F(ControlServerTest, BadJsonGetsAnErrorAndTheConnectionStaysUsable) {
  Start();
  UniqueFd fd = Raw();
  std::string bad = "{not json\n{\"verb\":\"reboot\"}\n{\"verb\":\"stop\"}\n{\"verb\":\"status\"}\n";
  ASSERT_EQ(::write(fd.get(), bad.data(), bad.size()), static_cast<ssize_t>(bad.size()));
  std::string all;
  for (int i = 0; i < 4; ++i) {
    // Replies come in order, one line each.
    std::string line;
    char c;
    while (::read(fd.get(), &c, 1) == 1 && c != '\n') line += c;
    all += line + "\n";
  }
  std::istringstream lines(all);
  std::string l1, l2, l3, l4;
  std::getline(lines, l1);
  std::getline(lines, l2);
  std::getline(lines, l3);
  std::getline(lines, l4);
  EXPECT_NE(l1.find("\"ok\":false"), std::string::npos) << l1;
  EXPECT_NE(l1.find("not JSON"), std::string::npos) << l1;
  EXPECT_NE(l2.find("unknown verb \\\"reboot\\\""), std::string::npos) << l2;
  EXPECT_NE(l3.find("stop needs a \\\"target\\\""), std::string::npos) << l3;
  EXPECT_NE(l4.find("\"ok\":true"), std::string::npos) << l4;
  EXPECT_NE(l4.find("step 7 loss 2.5"), std::string::npos) << l4;
}

TEST_F(ControlServerTest, OversizeRequestIsRefusedAndTheClientDropped) {
  Start();
  UniqueFd fd = Raw();
  std::string big(3 * kMaxControlRequestBytes, 'x');  // no newline: it would be buffered for ever
  ::send(fd.get(), big.data(), big.size(), MSG_NOSIGNAL);
  std::string line = ReadLine(fd.get());
  EXPECT_NE(line.find("longer than 4096 bytes"), std::string::npos) << line;
  EXPECT_TRUE(ClosedByServer(fd.get()));
  // The server is fine: the next client is served.
  EXPECT_TRUE(Call(ControlRequest{}).ok);
}

TEST_F(ControlServerTest, SilentClientsNeitherBlockOthersNorStayForEver) {
  ControlServer::Options o;
  o.max_clients = 2;
  o.idle_timeout = 1s;
  Start(o);
  UniqueFd silent1 = Raw();
  UniqueFd silent2 = Raw();
  UniqueFd silent3 = Raw();  // over the limit: the longest idle one goes
  ControlReply reply = Call(ControlRequest{});
  EXPECT_TRUE(reply.ok) << reply.error;
  EXPECT_TRUE(ClosedByServer(silent1.get()));
  // The idle timeout takes the rest, with nothing else happening.
  EXPECT_TRUE(ClosedByServer(silent2.get()));
  EXPECT_TRUE(ClosedByServer(silent3.get()));
  // The loop thread counts its clients after the turn that dropped them.
  auto deadline = std::chrono::steady_clock::now() + 10s;
  while (clients_.load() != 0 && std::chrono::steady_clock::now() < deadline) std::this_thread::sleep_for(5ms);
  EXPECT_EQ(clients_.load(), 0u);
}

TEST_F(ControlServerTest, ClientRefusesASocketOrRunDirOthersCouldHaveMade) {
  Start();
  std::string sock = dir_ + "/control.sock";
  ASSERT_EQ(::chmod(sock.c_str(), 0777), 0);
  UniqueFd fd;
  std::string err;
  EXPECT_EQ(ConnectControl(dir_, &fd, &err), ConnectResult::kInsecure);
  EXPECT_NE(err.find("mode 0777"), std::string::npos) << err;
  EXPECT_EQ(handler_.status_calls.load(), 0);
  ASSERT_EQ(::chmod(sock.c_str(), 0600), 0);
  ASSERT_EQ(::chmod(dir_.c_str(), 0777), 0);
  EXPECT_EQ(ConnectControl(dir_, &fd, &err), ConnectResult::kInsecure);
  EXPECT_NE(err.find("its directory"), std::string::npos) << err;
  ASSERT_EQ(::chmod(dir_.c_str(), 0700), 0);
  EXPECT_EQ(ConnectControl(dir_, &fd, &err), ConnectResult::kOk) << err;
  // A symlink in the socket's place (to the real socket, even) is not followed.
  ASSERT_EQ(::rename(sock.c_str(), (dir_ + "/real.sock").c_str()), 0);
  ASSERT_EQ(::symlink((dir_ + "/real.sock").c_str(), sock.c_str()), 0);
  EXPECT_EQ(ConnectControl(dir_, &fd, &err), ConnectResult::kInsecure);
  EXPECT_NE(err.find("not a socket"), std::string::npos) << err;
}

TEST_F(ControlServerTest, AClientThatNeverReadsItsRepliesIsDropped) {
  ControlServer::Options o;
  o.max_unsent_bytes = 64 << 10;
  Start(o);
  UniqueFd greedy = Raw();
  int small = 4096;
  ::setsockopt(greedy.get(), SOL_SOCKET, SO_RCVBUF, &small, sizeof small);
  std::string many;
  for (int i = 0; i < 2000; ++i) many += "{\"verb\":\"status\"}\n";
  // Written in the background: the server stops reading it once it is dropped.
  std::thread writer([&] { ::send(greedy.get(), many.data(), many.size(), MSG_NOSIGNAL); });
  // Others are served meanwhile, and the greedy one goes without our reading
  // a byte of its replies (the loop thread counts the clients after each turn).
  EXPECT_TRUE(Call(ControlRequest{}).ok);
  auto deadline = std::chrono::steady_clock::now() + 10s;
  while (clients_.load() != 0 && std::chrono::steady_clock::now() < deadline) std::this_thread::sleep_for(5ms);
  EXPECT_EQ(clients_.load(), 0u);
  EXPECT_TRUE(ClosedByServer(greedy.get()));
  bool dropped = true;
  ::shutdown(greedy.get(), SHUT_RDWR);
  writer.join();
  EXPECT_TRUE(dropped);
  EXPECT_TRUE(Call(ControlRequest{}).ok);
}

TEST_F(ControlServerTest, ServerRefusesAPeerOfAnotherUid) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root to become another user";
  Start();
  std::string sock = dir_ + "/control.sock";
  ASSERT_EQ(::chmod(sock.c_str(), 0777), 0);  // the file mode no longer keeps them out
  ASSERT_EQ(::chmod(dir_.c_str(), 0755), 0);
  int pipefd[2];
  ASSERT_EQ(::pipe2(pipefd, O_CLOEXEC), 0);
  pid_t pid = ::fork();
  if (pid == 0) {
    if (::setgid(65534) != 0 || ::setuid(65534) != 0) _exit(3);
    int fd = ::socket(AF_UNIX, SOCK_STREAM, 0);
    sockaddr_un a{};
    a.sun_family = AF_UNIX;
    std::strcpy(a.sun_path, sock.c_str());
    if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) _exit(4);
    const char req[] = "{\"verb\":\"stop\",\"target\":\"all\"}\n";
    ::send(fd, req, sizeof req - 1, MSG_NOSIGNAL);
    char buf[512];
    ssize_t r = ::read(fd, buf, sizeof buf);
    if (r > 0) (void)!::write(pipefd[1], buf, static_cast<size_t>(r));
    _exit(0);
  }
  ::close(pipefd[1]);
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
  std::string got = ReadLine(pipefd[0]);
  ::close(pipefd[0]);
  EXPECT_NE(got.find("refused: uid 65534 is not the run's owner"), std::string::npos) << got;
  Stop();
  EXPECT_EQ(handler_.last_target, "");  // the stop never reached the handler
}

TEST_F(ControlServerTest, APlantedSymlinkOrFileIsReplacedNeverFollowed) {
  std::string victim = dir_ + "/victim";
  { FILE* f = std::fopen(victim.c_str(), "w"); std::fputs("keep", f); std::fclose(f); }
  ASSERT_EQ(::symlink(victim.c_str(), (dir_ + "/control.sock").c_str()), 0);
  Start();
  struct stat st;
  ASSERT_EQ(::lstat((dir_ + "/control.sock").c_str(), &st), 0);
  EXPECT_TRUE(S_ISSOCK(st.st_mode));
  ASSERT_EQ(::lstat(victim.c_str(), &st), 0);
  EXPECT_TRUE(S_ISREG(st.st_mode));
  EXPECT_EQ(st.st_size, 4);
  EXPECT_TRUE(Call(ControlRequest{}).ok);
}

TEST_F(ControlServerTest, CloseUnlinksOnlyItsOwnSocket) {
  Start();
  Stop();
  EXPECT_FALSE(std::filesystem::exists(std::filesystem::symlink_status(dir_ + "/control.sock")));
  UniqueFd fd;
  std::string err;
  EXPECT_EQ(ConnectControl(dir_, &fd, &err), ConnectResult::kGone);
  // Someone else's file at the path when we close stays.
  stop_ = false;
  Start();
  std::string other = dir_ + "/control.sock";
  ASSERT_EQ(::unlink(other.c_str()), 0);
  { FILE* f = std::fopen(other.c_str(), "w"); std::fclose(f); }
  Stop();
  EXPECT_TRUE(std::filesystem::exists(other));
}

TEST_F(ControlServerTest, RefusesARunDirOthersMayWrite) {
  ASSERT_EQ(::chmod(dir_.c_str(), 0777), 0);
  ControlServer server;
  std::string err;
  EXPECT_FALSE(server.Open(dir_, &err));
  EXPECT_NE(err.find("not only ours to write"), std::string::npos) << err;
  EXPECT_FALSE(std::filesystem::exists(std::filesystem::symlink_status(dir_ + "/control.sock")));
}

TEST_F(ControlServerTest, ALongRunDirStillWorks) {
  std::string deep = dir_;
  while (deep.size() < 200) deep += "/a_rather_long_directory_name";
  std::string err;
  ASSERT_TRUE(MakeDirs(deep, 0700, &err)) << err;
  ControlServer server;
  ASSERT_TRUE(server.Open(deep, &err)) << err;
  UniqueFd fd;
  EXPECT_EQ(ConnectControl(deep, &fd, &err), ConnectResult::kOk) << err;
}

}  // namespace
}  // namespace dflash
