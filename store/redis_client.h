// A small synchronous Redis client over Debian's hiredis: the coordination store
// of multi-node runs (launcher) and the cluster-wide compile gate (worker) both
// speak to Redis through this and nothing else. One connection, used by one
// thread; every call has a deadline (connect and each command), and a broken
// connection is reconnected on the next call, so a restarted Redis costs a
// failed call, not a dead client.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "common/duration.h"
#include "store/store_auth.h"

namespace dflash {

/// Where the store is: `redis://host:port[/db]` (host may be `[v6]`; port
/// defaults to 6379, db to 0). Nothing else is accepted (no TLS, no query, and
/// no user or password: a password in a URL ends up in argv, logs and `check`;
/// it comes from StoreAuth): a URL we cannot honour is an error, not silently ignored.
struct StoreUrl {
  std::string host;
  int port = 6379;
  int db = 0;
  std::string ToString() const;
};
bool ParseStoreUrl(const std::string& text, StoreUrl* url, std::string* err);

/// One reply, copied out of hiredis's tree.
struct RedisReply {
  enum class Type { kNil, kString, kStatus, kInteger, kArray, kError };
  Type type = Type::kNil;
  std::string str;        ///< kString, kStatus, kError
  int64_t integer = 0;    ///< kInteger
  std::vector<RedisReply> elements;  ///< kArray

  bool nil() const { return type == Type::kNil; }
  bool ok() const { return type == Type::kStatus && str == "OK"; }
};

class RedisClient {
 public:
  /// `timeout`: for connecting and for each command's reply. `auth`: sent
  /// (AUTH [user] password) on every new connection, before anything else.
  explicit RedisClient(StoreUrl url, Millis timeout = Millis(2000), StoreAuth auth = {});
  ~RedisClient();
  RedisClient(const RedisClient&) = delete;
  RedisClient& operator=(const RedisClient&) = delete;

  /// Connects now if not connected (AUTHs, and SELECTs the db). False: `err` says why
  /// ("redis://h:6379: Connection refused"); an auth failure (NOAUTH, WRONGPASS, a
  /// connection closed after AUTH) says so and ends with `auth.hint`.
  bool Connect(std::string* err);
  /// Runs one command (binary-safe arguments). False on a connection or
  /// protocol failure (the connection is dropped; the next call reconnects) and
  /// on an error reply (its text in `err`, the connection kept).
  bool Command(const std::vector<std::string>& argv, RedisReply* reply, std::string* err);
  /// EVAL `script` with `keys` and `args`: the fenced updates are Lua scripts,
  /// so a check and its write are one step on the server.
  bool Eval(const std::string& script, const std::vector<std::string>& keys, const std::vector<std::string>& args,
            RedisReply* reply, std::string* err);
  bool connected() const;
  /// The last failed call failed on credentials (NOAUTH, WRONGPASS, closed after AUTH): retrying
  /// will not help, a person must set the password (`auth.hint`).
  bool auth_refused() const { return auth_refused_; }
  /// How many connections this client has made so far: a caller can tell "the same connection all
  /// along" (the server cannot have restarted) from "reconnected since".
  uint64_t connection_count() const { return connections_; }
  void Disconnect();
  /// From another thread: ends a call blocked in this client (a blocking read, XREAD BLOCK) at once
  /// (shutdown of its socket), and every later call fails at once. For a client whose owner thread
  /// must be joined without waiting out its block.
  void Interrupt();
  const StoreUrl& url() const { return url_; }

 private:
  struct Impl;
  std::string AuthError(const std::string& what) const;
  /// On the new connection: the server answers a fresh challenge with auth_.proof_key (a private store).
  bool ServerProvesKey(std::string* why);
  StoreUrl url_;
  Millis timeout_;
  StoreAuth auth_;
  uint64_t connections_ = 0;
  bool auth_refused_ = false;
  std::map<std::string, std::string> scripts_sha1_;  ///< Eval's scripts, by their text: EVALSHA's digest
  std::unique_ptr<Impl> impl_;
};

}  // namespace dflash
