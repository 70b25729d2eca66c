// While a follower waits at the gate: a leader whose processes used almost no CPU for a window is not
// compiling, it is blocked -- the classic cause is a process group whose leader waits for peers that wait here.
// Said once per window, with that likely cause (docs/cachelock.md, "A hint instead of a silent hour").
#pragma once

#include <chrono>
#include <string>

#include "cachelock/gate.h"
#include "common/duration.h"

namespace dflash {

/// Watches the leader's tree while we wait, and says once per idle window
/// when it is not compiling: the classic cause is a leader blocked on peers.
class IdleLeaderHint {
 public:
  IdleLeaderHint(Millis window, std::string key) : window_(window), key_(std::move(key)) {}

  /// The hint, when one is due; empty otherwise.
  std::string Tick(CompileGate& gate);

 private:
  Millis window_;
  std::string key_, token_;
  std::chrono::steady_clock::time_point since_{};
  double cpu0_ = 0;
};

}  // namespace dflash
