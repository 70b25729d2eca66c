#include "launcher/cluster/private_store.h"

#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <csignal>

#include "common/fd.h"
#include "common/spawn.h"
#include "store/redis_client.h"

namespace dflash {

PrivateStore::~PrivateStore() { Stop(); }

bool PrivateStore::Start(const std::string& bind, int port, const std::string& dir,
                         const std::vector<std::string>& env, std::string* err, const FileMode& files) {
  std::string log_path = dir + "/store.log", log_err;
  UniqueFd log(OpenPrivateFile(log_path, O_WRONLY | O_APPEND, files, RunDirUse(), &log_err));
  SpawnOptions so;
  // No persistence (a restart is an empty store, which the coordinator handles);
  // protected mode off: it is bound to MASTER_ADDR on purpose, for the other nodes.
  so.argv = {"redis-server", "--port", std::to_string(port), "--bind", bind, "--save", "", "--appendonly", "no",
             "--protected-mode", "no", "--dir", dir, "--daemonize", "no", "--loglevel", "warning"};
  so.env = env;
  so.stdout_fd = log ? log.get() : kDevNullFd;
  so.stderr_fd = log ? log.get() : kDevNullFd;
  so.group = SpawnOptions::Group::kNewSession;  // a Ctrl-C at the terminal is the launcher's to handle
  so.death_signal = SIGKILL;                    // dies with the launcher, even a SIGKILLed one
  Child child;
  if (!Spawn(so, &child, err)) {
    if (child.pid > 0) ::waitpid(child.pid, nullptr, 0);
    *err = "cannot start redis-server for the private store: " + *err + " (scripts/setup installs it)";
    return false;
  }
  pid_ = child.pid;
  StoreUrl url;
  url.host = bind;
  url.port = port;
  RedisClient client(url, Millis(500));
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  std::string cerr;
  while (std::chrono::steady_clock::now() < deadline) {
    int status = 0;
    if (::waitpid(pid_, &status, WNOHANG) == pid_) {
      pid_ = -1;
      *err = "the private store's redis-server on " + bind + ":" + std::to_string(port) + " " +
             DecodeWaitStatus(status).Describe() + " (port in use? see " + log_path + ")";
      return false;
    }
    RedisReply r;
    if (client.Command({"PING"}, &r, &cerr)) return true;
    ::usleep(50 * 1000);
  }
  Stop();
  *err = "the private store's redis-server on " + bind + ":" + std::to_string(port) + " did not answer within 10 s: " +
         cerr + " (see " + log_path + ")";
  return false;
}

void PrivateStore::Stop() {
  if (pid_ <= 0) return;
  ::kill(pid_, SIGTERM);
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(2);
  for (;;) {
    pid_t r = ::waitpid(pid_, nullptr, WNOHANG);
    if (r == pid_ || (r < 0 && errno == ECHILD)) break;  // ECHILD: the supervisor's reaper took it
    if (std::chrono::steady_clock::now() >= deadline) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, nullptr, 0);
      break;
    }
    ::usleep(10 * 1000);
  }
  pid_ = -1;
}

}  // namespace dflash
