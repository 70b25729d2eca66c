// The news of one run's session, pushed by the store (docs/multinode.md, "One watcher"): a thread of
// its own with its own connection, blocked in XREAD on the session's `news` stream, that calls
// `ring` when an entry arrives (a failure published, a round begun or completed). The entries carry
// nothing a node acts on: it reads the session's keys again and validates them as on any poll, so a
// forged entry costs one extra poll. A stream rather than pub/sub: an entry added while this
// connection was away is read when it is back (from the last id seen), a message is not.
#pragma once

#include <atomic>
#include <functional>
#include <string>
#include <thread>

#include "common/duration.h"
#include "store/redis_client.h"

namespace dflash {

class StoreDoorbell {
 public:
  /// `block`: how long one XREAD waits on the server (a store away is retried after `retry`).
  StoreDoorbell(StoreUrl url, StoreAuth auth, std::string stream, Millis block, Millis retry,
                std::function<void()> ring);
  ~StoreDoorbell();  ///< interrupts the blocked read (shutdown of its socket) and joins: no wait of `block`
  StoreDoorbell(const StoreDoorbell&) = delete;
  StoreDoorbell& operator=(const StoreDoorbell&) = delete;

 private:
  void Loop();
  RedisClient client_;
  std::string stream_;
  Millis block_, retry_;
  std::function<void()> ring_;
  std::atomic<bool> quit_{false};
  std::thread thread_;
};

}  // namespace dflash
