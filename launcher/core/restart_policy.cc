#include "launcher/core/restart_policy.h"

#include <algorithm>

#include "common/duration.h"
#include "common/exit_codes.h"

namespace dflash {

RestartDecision RestartTracker::OnExit(int exit_code, Millis runtime, SteadyTime now, bool zero_is_failure) {
  using Kind = RestartDecision::Kind;
  const bool failed = exit_code != 0 || zero_is_failure;
  if (spec_.policy == RestartPolicy::kNever)
    return {Kind::kNoRestart, Millis(0), "restart policy is \"never\""};
  if (spec_.policy == RestartPolicy::kOnFailure && !failed)
    return {Kind::kNoRestart, Millis(0), "exited 0 (policy on-failure restarts failures only)"};
  // A frame (or the shapes a producer makes) that breaks the [model] contract
  // breaks it again after a restart: restarting would only spend the budget.
  if (exit_code == exit_code::kFrameContract)
    return {Kind::kNoRestart, Millis(0),
            "exit code 65: a hidden-state frame violates the [model] contract (never restarted)"};
  // A checkpoint that cannot be restored exactly is refused again by every restart (it is still there, or its
  // frames are still gone): the person must choose (docs/checkpoints.md).
  if (exit_code == exit_code::kCheckpointRefused)
    return {Kind::kNoRestart, Millis(0),
            "exit code 78: a checkpoint cannot be restored exactly (never restarted)"};
  const auto& codes = spec_.no_restart_exit_codes;
  if (std::find(codes.begin(), codes.end(), exit_code) != codes.end())
    return {Kind::kNoRestart, Millis(0), "exit code " + std::to_string(exit_code) + " is in no_restart_exit_codes"};

  while (!recent_.empty() && now - recent_.front() >= spec_.window) recent_.pop_front();
  if (static_cast<int>(recent_.size()) >= spec_.max) {
    return {Kind::kExhausted, Millis(0),
            "restart budget exhausted: " + std::to_string(recent_.size()) + " restarts within " +
                FormatDuration(spec_.window) + " (max " + std::to_string(spec_.max) + ")"};
  }
  // A process that ran long enough was healthy: its failure starts the backoff
  // afresh (systemd#43813 is what happens when it never resets).
  if (runtime >= spec_.reset_after) next_delay_ = spec_.backoff_min;
  RestartDecision d{Kind::kRestart, next_delay_,
                    "restart " + std::to_string(recent_.size() + 1) + " of " + std::to_string(spec_.max) +
                        " within " + FormatDuration(spec_.window) + ", after " + FormatDuration(next_delay_)};
  next_delay_ = std::min(next_delay_ * 2, spec_.backoff_max);
  if (next_delay_ < spec_.backoff_min) next_delay_ = spec_.backoff_min;
  recent_.push_back(now);
  ++total_;
  return d;
}

bool GuardianRestarts::OnDeath(SteadyTime now) {
  deaths_.erase(std::remove_if(deaths_.begin(), deaths_.end(), [&](SteadyTime t) { return now - t > kWindow; }),
                deaths_.end());
  deaths_.push_back(now);
  return deaths() <= kMax;
}

}  // namespace dflash
