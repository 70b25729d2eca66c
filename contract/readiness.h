// Readiness judged once, for every process that has a ReadySpec: the worker's
// payload host and the supervisor (for the processes it runs with no worker)
// feed it what they saw -- exec, READY=1, an output line, the ready file, the
// exit, the time -- and it answers ready / timed out / failed. Pure: no I/O and
// no clock of its own, so every rule is tested without a process.
#pragma once

#include <chrono>
#include <optional>
#include <string>
#include <string_view>

#include "contract/ready_spec.h"

namespace dflash {

class Readiness {
 public:
  using Clock = std::chrono::steady_clock;

  enum class Verdict {
    kWaiting,   ///< no evidence yet, deadline not reached
    kReady,     ///< ready (reported once: the call that made it returns true)
    kTimedOut,  ///< the deadline passed first
    kFailed,    ///< the process ended without (counting) readiness
  };

  explicit Readiness(const ReadySpec& spec) : spec_(spec) {}

  /// Compiles the log pattern; false with the reason ("bad regex '...': ...").
  bool Init(std::string* err);

  Verdict verdict() const { return verdict_; }
  bool waiting() const { return verdict_ == Verdict::kWaiting; }
  const ReadySpec& spec() const { return spec_; }

  // Events. Each returns true exactly when that event made the process ready:
  // the caller then runs its on-ready action, once.

  /// The process was started at `now`: the deadline counts from here, and
  /// `none` is ready at once.
  bool OnExec(Clock::time_point now);
  /// READY=1 from the process (or its group): `notify` evidence.
  bool OnNotifyReady();
  /// A whole output line; `stream` 0 = stdout, 1 = stderr: `log` evidence on a match.
  bool OnLine(int stream, std::string_view line);
  /// The caller found the `file` path present (it does the stat; see WantsFileCheck).
  bool OnFileExists();
  /// One try of a tcp/http probe ended (the caller connects; see WantsProbe):
  /// `answered` as contract/probe_spec.h JudgeProbe said; `detail` is kept
  /// for the timeout message ("last try: connection refused").
  bool OnProbe(bool answered, const std::string& detail);
  /// The process ended (`ok`: exited 0). From now on evidence counts only if
  /// it ended well: the last words of a crashing process (a traceback that
  /// echoes the pattern) do not. Call, drain the evidence it left queued
  /// (notify, pipes, the file), then call OnExitDrained.
  void OnExit(bool ok);
  /// After the exit's queued evidence was fed: `exit` is ready on exit 0;
  /// anything still waiting has failed.
  bool OnExitDrained();
  /// The clock: true when this call found the deadline passed (kTimedOut).
  bool OnClock(Clock::time_point now);

  /// `d` passed while the one judging could not look (it was paused): the
  /// deadline moves by `d`, as if that time had not passed.
  void Postpone(Clock::duration d) {
    if (started_) *started_ += d;
  }

  /// When OnClock should next be called; empty: no deadline (timeout 0, not
  /// started yet, or not waiting any more).
  std::optional<Clock::time_point> deadline() const;
  /// Mode `file` and still waiting: the caller should stat the path.
  bool WantsFileCheck() const { return waiting() && spec_.mode == ReadyMode::kFile; }
  /// Mode `tcp`/`http`, started and still waiting: the caller should probe.
  bool WantsProbe() const { return waiting() && started_ && spec_.probes(); }
  /// Mode `log` and still waiting: lines are worth feeding.
  bool WantsLines() const { return waiting() && spec_.mode == ReadyMode::kLog; }

  /// "not ready after 20m (ready = notify: no READY=1 received)".
  std::string TimeoutText() const;
  /// Set when evidence arrived from a process that then failed:
  /// "readiness evidence from a payload that exited with code 3 does not count"
  /// needs the caller's wording of the exit, so this only says it happened.
  bool discounted_evidence() const { return discounted_; }
  /// What the last failed probe saw ("connection refused"), or "".
  const std::string& last_probe() const { return last_probe_; }

 private:
  bool Evidence();

  ReadySpec spec_;
  std::optional<Clock::time_point> started_;
  LineMatcher matcher_;
  Verdict verdict_ = Verdict::kWaiting;
  bool exited_ = false;
  bool exit_ok_ = false;
  bool discounted_ = false;
  std::string last_probe_;  ///< what the last failed probe saw
};

}  // namespace dflash
