// Test support: a private redis-server on loopback (Debian's redis-server), for
// the tests of the Redis store and of what coordinates through it. No disk
// persistence; its dir is a TempDir. Restart() brings it back on the same port
// with nothing in it, as a Redis restarted without persistence comes back.
#pragma once

#include <sys/types.h>

#include <string>

#include "testing/temp_dir.h"

namespace dflash::test {

class RedisServer {
 public:
  RedisServer();
  ~RedisServer();  ///< stops it (SIGKILL if it does not go on SIGTERM) and reaps it
  RedisServer(const RedisServer&) = delete;
  RedisServer& operator=(const RedisServer&) = delete;

  /// Before Start: require this password (given in a 0600 config file, not argv).
  void set_password(std::string password) { password_ = std::move(password); }
  const std::string& password() const { return password_; }
  /// Starts on a free loopback port and waits until it answers PING. False (and
  /// a test failure) if it cannot: no redis-server on PATH, or it never answered.
  bool Start();
  /// Stops it now (SIGKILL: a crash, nothing flushed) and reaps it.
  void Kill();
  /// Kill(), then starts again on the same port, empty.
  bool Restart();

  int port() const { return port_; }
  pid_t pid() const { return pid_; }
  std::string url() const { return "redis://127.0.0.1:" + std::to_string(port_); }

 private:
  bool StartOn(int port);
  TempDir dir_{"dflash-redis"};
  std::string password_;
  int port_ = 0;
  pid_t pid_ = -1;
};

/// A port that was free on 127.0.0.1 a moment ago (bind to 0, read, close).
int FreeLoopbackPort();

}  // namespace dflash::test
