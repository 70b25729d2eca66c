// When a failed process comes back, and when the run gives up: the restart
// budget (max restarts within a sliding window) and the exponential backoff of
// one restart unit (a process, a role, or the whole run — RestartSpec.scope).
// Pure policy over times it is given, so it is unit-tested with a fake clock.
#pragma once

#include <chrono>
#include <deque>
#include <vector>
#include <string>

#include "common/duration.h"
#include "launcher/config/config.h"

namespace dflash {

struct RestartDecision {
  enum class Kind {
    kRestart,    ///< start again after `delay`
    kNoRestart,  ///< stays ended: success, policy never, or a no-restart exit code
    kExhausted,  ///< a failure beyond the budget: FATAL, the run stops
  };
  Kind kind = Kind::kNoRestart;
  Millis delay{0};
  std::string reason;  ///< for people: "exit code 3 is in no_restart_exit_codes"
};

class RestartTracker {
 public:
  explicit RestartTracker(const RestartSpec& spec) : spec_(spec), next_delay_(spec.backoff_min) {}

  /// A member of the unit ended with shell-style `exit_code` (128+N for signal
  /// N) after running `runtime`. Records the restart it grants. `zero_is_failure`: a
  /// service, whose every end before the run's is a failure, exit 0 included.
  RestartDecision OnExit(int exit_code, Millis runtime, SteadyTime now, bool zero_is_failure = false);

  /// Restarts granted so far (all time).
  int restarts() const { return total_; }
  /// The delay the next restart would get (for tests and the console).
  Millis next_delay() const { return next_delay_; }

 private:
  RestartSpec spec_;
  std::deque<SteadyTime> recent_;  // restarts granted within the window
  Millis next_delay_;
  int total_ = 0;
};

/// dflash-guardian's own budget (docs/design.md, "Nothing outlives the run"): a guardian that dies is replaced
/// at once, unless it died more than kMax times within kWindow; then the run stops, since a run nobody can clean
/// up after must not go on.
class GuardianRestarts {
 public:
  static constexpr int kMax = 3;
  static constexpr Millis kWindow{60000};
  /// A guardian died at `now`: true if a new one may start.
  bool OnDeath(SteadyTime now);
  /// Its deaths within kWindow of the last one, that one included.
  int deaths() const { return static_cast<int>(deaths_.size()); }

 private:
  std::vector<SteadyTime> deaths_;  ///< within kWindow
};

}  // namespace dflash
