#include "launcher/cluster/private_store.h"

#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdio>

#include "common/exit_codes.h"
#include "common/fd.h"
#include "common/listener_owner.h"
#include "common/spawn.h"
#include "store/redis_client.h"
#include "store/store_auth.h"

namespace dflash {

namespace {

/// A Redis config value in double quotes (redis's sdssplitargs reads \\, \" and \xHH back).
std::string Quoted(const std::string& v) {
  std::string out = "\"";
  for (unsigned char c : v) {
    if (c == '\\' || c == '"') {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c < 0x20 || c >= 0x7f) {
      char buf[5];
      std::snprintf(buf, sizeof buf, "\\x%02x", c);
      out += buf;
    } else {
      out += static_cast<char>(c);
    }
  }
  return out + "\"";
}

}  // namespace

PrivateStore::~PrivateStore() { Stop(); }

const std::vector<std::string>& PrivateStore::DisabledCommands() {
  // Stop it (SHUTDOWN), rewrite its config or dir and dump files anywhere it can write (CONFIG, SAVE,
  // BGSAVE, BGREWRITEAOF), load code (MODULE, DEBUG), copy or hand its data elsewhere (MIGRATE,
  // REPLICAOF, SLAVEOF, SYNC, PSYNC, FAILOVER), change who may log in (ACL), wipe it (FLUSHALL,
  // FLUSHDB) or watch every command (MONITOR). The coordinator needs none of them.
  static const std::vector<std::string> k = {"CONFIG",  "SHUTDOWN", "DEBUG",   "SAVE",      "BGSAVE",
                                             "BGREWRITEAOF", "MODULE", "MIGRATE", "REPLICAOF", "SLAVEOF",
                                             "SYNC",    "PSYNC",    "FAILOVER", "ACL",      "FLUSHALL",
                                             "FLUSHDB", "MONITOR"};
  return k;
}

std::string PrivateStore::ConfigText(const std::string& bind, int port, const std::string& dir,
                                     const std::string& password) {
  // No persistence (a restart is an empty store, which the coordinator handles); bound to MASTER_ADDR
  // for the other nodes, so the password is what keeps the host's other users out; noeviction: a
  // registration is never evicted under memory pressure (a write fails loudly instead).
  std::string c = "port " + std::to_string(port) + "\nbind " + bind +
                  "\nprotected-mode yes\nsave \"\"\nappendonly no\ndaemonize no\nloglevel warning\n"
                  "maxmemory-policy noeviction\ndir " + Quoted(dir) + "\nrequirepass " + Quoted(password) + "\n";
  // The proof login (store/store_auth.h kProveUser): anyone may use it, and it may only call the read-only
  // function that proves this store knows the run's secret, so a client learns whom it talks to before AUTH.
  c += std::string("user ") + kProveUser + " on >" + kProvePassword + " -@all +fcall_ro\n";
  for (const std::string& cmd : DisabledCommands()) c += "rename-command " + cmd + " \"\"\n";
  return c;
}

bool PrivateStore::Start(const std::string& bind, int port, const std::string& dir, const std::string& password,
                         const std::string& proof_key, const std::vector<std::string>& env, std::string* err,
                         const FileMode& files) {
  std::string log_path = dir + "/store.log", log_err;
  UniqueFd log(OpenPrivateFile(log_path, O_WRONLY | O_APPEND, files, RunDirUse(), &log_err));
  // The config, password included, goes in on stdin (`redis-server -`): never argv (/proc/*/cmdline is
  // world-readable), never a file. It is small enough for the pipe's buffer, so it is written first.
  int pipe_fds[2];
  if (::pipe2(pipe_fds, O_CLOEXEC) != 0) {
    *err = ErrnoMessage("pipe2", errno);
    return false;
  }
  UniqueFd config_in(pipe_fds[0]);
  {
    UniqueFd config_out(pipe_fds[1]);
    if (!WriteAll(config_out.get(), ConfigText(bind, port, dir, password), err)) return false;
  }
  SpawnOptions so;
  so.argv = {"redis-server", "-"};
  so.env = env;
  so.stdin_fd = config_in.get();
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
  port_ = port;
  config_in.reset();
  StoreUrl url;
  url.host = bind;
  url.port = port;
  StoreAuth auth;
  auth.password = password;
  RedisClient client(url, Millis(500), auth);
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
    // Nothing is sent (AUTH carries the run's password, the key its kernels are signed with) until the
    // listener is proven to be this redis-server's own socket: another user may have bound the port
    // between our probe and its bind (common/listener_owner.h).
    std::string who;
    switch (Prove(&who)) {
      case ListenerProof::kNone:
        cerr = "not listening yet";
        ::usleep(50 * 1000);
        continue;
      case ListenerProof::kForeign:
        Stop();
        *err = "the private store's port " + std::to_string(port) + " is held by " + who +
               ", not by the run's redis-server: nothing was sent to it (the port was taken after the launcher "
               "reserved it; pick another master_port, or find who took it)";
        return false;
      case ListenerProof::kOurs:
        break;
    }
    RedisReply r;
    if (client.Command({"PING"}, &r, &cerr)) {
      // Before any other client may connect (they prove the store first): the function that answers them.
      if (client.Command({"FUNCTION", "LOAD", "REPLACE", PrivateStoreProveLibrary(proof_key)}, &r, &cerr)) return true;
      Stop();
      *err = "the private store's redis-server cannot load its proof function: " + cerr + " (see " + log_path + ")";
      return false;
    }
    ::usleep(50 * 1000);
  }
  Stop();
  *err = "the private store's redis-server on " + bind + ":" + std::to_string(port) + " did not answer within 10 s: " +
         cerr + " (see " + log_path + ")";
  return false;
}

ListenerProof PrivateStore::Prove(std::string* who) const {
  if (pid_ <= 0) return ListenerProof::kNone;
  std::string err;
  return ProveListener(port_, pid_, who, &err);
}

NodeStop PrivateStore::Ended(const std::string& how) const {
  NodeStop stop;
  stop.culprit.kind = NodeCulprit::Kind::kPrivateStore;
  stop.culprit.node = 0;
  stop.reason = "the private store (redis-server pid " + std::to_string(pid_) + ") " + how + ": the run's store is gone";
  stop.exit_code = exit_code::kNodeFailed;
  return stop;
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
