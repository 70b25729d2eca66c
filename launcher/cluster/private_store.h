// `[run] store = "private"`: node 0's launcher runs a redis-server (Debian's) for
// the run, on MASTER_ADDR at the plan's store port, with no persistence; it dies
// with the launcher (PR_SET_PDEATHSIG) and is stopped once the other nodes are done.
// Another user of the host can reach its port, so it requires the run's password
// (given on stdin, never argv) and has the commands that could stop it, rewrite
// its config or write files (CONFIG, SHUTDOWN, DEBUG, SAVE, MODULE, ...) renamed away.
// Another user can also bind the port first (between our probe and redis-server's
// bind): the password is sent only to a listener proven to be our child's socket,
// and another node's launcher, which cannot see our sockets, sends it only to a
// store that answered a fresh challenge with a key derived from the run's secret.
#pragma once

#include "common/listener_owner.h"
#include "common/private_files.h"
#include "launcher/core/node_culprit.h"

#include <sys/types.h>

#include <string>
#include <vector>

namespace dflash {

class PrivateStore {
 public:
  PrivateStore() = default;
  ~PrivateStore();  ///< Stop()
  PrivateStore(const PrivateStore&) = delete;
  PrivateStore& operator=(const PrivateStore&) = delete;

  /// Starts `redis-server` (PATH of `env`) bound to `bind` on `port`, requiring
  /// `password`, its log in `dir`/store.log, and waits (at most 10 s) until it
  /// answers PING (its log made as `files` says, common/private_files.h), then
  /// loads the function that proves it knows `proof_key` (store/store_auth.h
  /// PrivateStoreProveLibrary) before any other client connects. REQUIRES: called from the thread
  /// that lives as long as the store should; `password` not empty. False: `err`.
  bool Start(const std::string& bind, int port, const std::string& dir, const std::string& password,
             const std::string& proof_key, const std::vector<std::string>& env, std::string* err,
             const FileMode& files = FileMode::Private());

  /// The commands renamed away (rename-command X ""): what a holder of the
  /// password still cannot do to the run's store. Exposed for the tests.
  static const std::vector<std::string>& DisabledCommands();
  /// The config file text given to redis-server on stdin (exposed for the tests).
  static std::string ConfigText(const std::string& bind, int port, const std::string& dir,
                                const std::string& password);
  /// SIGTERM, then SIGKILL after 2 s; reaps it (if the supervisor's reaper has
  /// not already: it is a child of ours).
  void Stop();
  pid_t pid() const { return pid_; }
  /// What its end means for the run, once the supervisor has reaped it (`how`: "killed by SIGKILL"): its port is
  /// free for anyone now, so the run stops, node 0's private store its culprit, rather than reconnect to whatever
  /// binds the port next (SupervisorOptions::kept).
  NodeStop Ended(const std::string& how) const;

  /// Whether what listens on the store's port is this redis-server's own socket
  /// (common/listener_owner.h): nothing is sent to the port before this holds,
  /// on the first connection and on every reconnection (StoreAuth::verify_server).
  /// kForeign: `who` names the squatter; kNone: nothing listens (or the server has ended).
  ListenerProof Prove(std::string* who) const;

 private:
  pid_t pid_ = -1;
  int port_ = 0;
};

}  // namespace dflash
