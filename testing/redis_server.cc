#include "testing/redis_server.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>

#include <gtest/gtest.h>

#include "store/redis_client.h"
#include "testing/process.h"
#include "testing/wait.h"

namespace dflash::test {

int FreeLoopbackPort() {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return 0;
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof a;
  int port = 0;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0 &&
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0)
    port = ntohs(a.sin_port);
  ::close(fd);
  return port;
}

RedisServer::RedisServer() = default;
RedisServer::~RedisServer() { Kill(); }

bool RedisServer::StartOn(int port) {
  ProcessOptions o;
  o.argv = {"redis-server", "--port", std::to_string(port), "--bind", "127.0.0.1", "--save", "",
            "--appendonly", "no", "--dir", dir_.path(), "--daemonize", "no", "--loglevel", "warning"};
  if (!password_.empty()) {
    std::string conf = dir_ / "redis.conf", err;
    if (!WriteSecretFile(conf, "requirepass " + password_, &err)) {
      ADD_FAILURE() << err;
      return false;
    }
    o.argv.insert(o.argv.begin() + 1, conf);  // the config file first: its path, not the password, is in argv
  }
  o.out = Output::File(dir_ / "redis.log");
  o.err = Output::File(dir_ / "redis.err");
  Process p;
  std::string err;
  if (!StartProcess(o, &p, &err)) {
    ADD_FAILURE() << "cannot start redis-server: " << err;
    return false;
  }
  pid_ = p.pid;
  StoreUrl url{"127.0.0.1", port, 0};
  bool up = WaitUntil(
      [&] {
        StoreAuth auth;
        auth.password = password_;
        RedisClient c(url, Millis(200), auth);
        RedisReply r;
        std::string e;
        return c.Command({"PING"}, &r, &e) && r.str == "PONG";
      },
      std::chrono::seconds(20));
  if (!up) {
    Kill();
    return false;
  }
  port_ = port;
  return true;
}

bool RedisServer::Start() {
  for (int i = 0; i < 5; ++i) {  // the free port may be taken before redis binds it
    if (StartOn(FreeLoopbackPort())) return true;
  }
  ADD_FAILURE() << "redis-server did not come up on a free loopback port (is it installed? scripts/setup)";
  return false;
}

void RedisServer::Kill() {
  if (pid_ <= 0) return;
  ::kill(pid_, SIGKILL);
  WaitForExit(pid_);
  pid_ = -1;
}

bool RedisServer::Restart() {
  int port = port_;
  Kill();
  return StartOn(port);
}

}  // namespace dflash::test
