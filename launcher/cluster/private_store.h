// `[run] store = "private"`: node 0's launcher runs a redis-server (Debian's) for
// the run, on MASTER_ADDR at the plan's store port, with no persistence; it dies
// with the launcher (PR_SET_PDEATHSIG) and is stopped once the other nodes are done.
#pragma once

#include "common/private_files.h"

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

  /// Starts `redis-server` (PATH of `env`) bound to `bind` on `port`, its log in
  /// `dir`/store.log (made as `files` says, common/private_files.h), and waits (at most 10 s) until it answers PING. REQUIRES:
  /// called from the thread that lives as long as the store should. False: `err`.
  bool Start(const std::string& bind, int port, const std::string& dir, const std::vector<std::string>& env,
             std::string* err, const FileMode& files = FileMode::Private());
  /// SIGTERM, then SIGKILL after 2 s; reaps it (if the supervisor's reaper has
  /// not already: it is a child of ours).
  void Stop();
  pid_t pid() const { return pid_; }

 private:
  pid_t pid_ = -1;
};

}  // namespace dflash
