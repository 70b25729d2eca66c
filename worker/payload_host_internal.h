// The payload host's one object, shared by its parts; not part of the API
// (worker/payload_host.h is). Each part is a file with one job:
//   payload_host.cc         setup, spawn, the epoll loop and its timer
//   payload_host_ready.cc   readiness evidence: notify datagrams, the ready file
//   payload_host_group.cc   signals, reaping, stopping the payload's group
//   payload_host_output.cc  the payload's stdout/stderr pipes (log mode)
#pragma once

#include <sys/types.h>

#include <array>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/fd.h"
#include "common/notify.h"
#include "common/signal_fd.h"
#include "common/spawn.h"
#include "contract/readiness.h"
#include "worker/output_relay.h"
#include "worker/payload_host.h"

namespace dflash {

class PayloadHost {
 public:
  using Clock = std::chrono::steady_clock;

  explicit PayloadHost(const PayloadHostOptions& o);
  ~PayloadHost();

  PayloadResult Run();

 private:
  /// How often a `file` readiness path is checked. A timer rather than inotify:
  /// the path may be on NFS (inotify sees only local changes) and its directory
  /// may not exist yet.
  static constexpr auto kFileTick = std::chrono::milliseconds(100);
  /// While leftovers of the payload's group run after the payload exited: how
  /// often to look whether the group is empty (members that are not our
  /// children send us no SIGCHLD), and how long to wait after SIGKILL.
  static constexpr auto kGroupPollTick = std::chrono::milliseconds(100);
  static constexpr auto kGiveUpAfterKill = std::chrono::seconds(5);
  /// Bytes read from one pipe per wake-up, so a chatty payload cannot starve
  /// signal handling.
  static constexpr size_t kReadBudget = 1 << 20;

  enum Tag : uint32_t { kTagSignal, kTagTimer, kTagNotify, kTagStdout, kTagStderr };

  // payload_host.cc
  bool Setup(std::vector<std::string>* env, std::string* err);
  void Loop();
  std::string Label() const { return name_ + " (pid " + std::to_string(pid_) + ")"; }
  PayloadResult Result() const;
  void OnTimer();
  void ArmTimer();
  /// After each wait: a wake-up much later than the timer asked for is time
  /// this host did not see (it was stopped with the whole run): the readiness
  /// timeout and the stop grace get it back (contract/pause.h).
  void CheckPause(Clock::time_point now);

  // payload_host_ready.cc
  /// Feeds one piece of evidence to readiness_; runs Ready() if it made the
  /// payload ready. A payload that already died (unreaped) is reaped first,
  /// so its exit status judges what it left.
  void Evidence(const std::function<bool()>& feed);
  /// Once, when readiness_ said ready: on_ready, then stop_when_ready.
  void Ready();
  bool PayloadIsZombie() const;
  void OnNotify();
  void CheckFile();

  // payload_host_group.cc
  void OnSignals();
  void Forward(int sig);
  void Reap();
  void PayloadExited(int status);
  void StartStop();
  bool GroupAlive() const;
  void CheckDone();

  // payload_host_output.cc
  /// Log mode: one relay per stream, each line to readiness_ while it wants lines.
  void MakeRelays();
  /// Log mode: pipes for the payload's stdout/stderr, read ends watched by
  /// epoll_, write ends into `so` (kept open in `write_ends` until the spawn).
  bool OpenPipes(SpawnOptions* so, std::array<UniqueFd, 2>* write_ends, std::string* err);
  /// Reads pipe `i`; `budget` bytes at most (SIZE_MAX: until EAGAIN or EOF).
  void OnPipe(int i, size_t budget);
  /// After the loop: what is still buffered, and the partial last lines.
  void DrainPipes();

  const PayloadHostOptions& o_;
  std::string name_;
  pid_t pid_ = -1;
  pid_t ppid0_ = 0;

  SignalFd signals_;
  UniqueFd epoll_, timer_;
  NotifyListener listener_;
  std::optional<Readiness> readiness_;  // contract/readiness.h: the one judge of readiness
  std::array<UniqueFd, 2> pipes_;  // read ends of the payload's stdout/stderr (log mode)
  std::array<std::unique_ptr<OutputRelay>, 2> relays_;

  int was_subreaper_ = 0;
  bool timed_out_ = false;
  bool parent_died_ = false;
  bool exited_ = false;
  bool stopping_ = false;
  bool kill_sent_ = false;
  bool done_ = false;
  bool stopped_when_ready_ = false;
  ExitStatus status_;
  std::string message_;

  std::optional<Clock::time_point> file_tick_, kill_deadline_, group_poll_,
      give_up_;
  std::optional<Clock::time_point> armed_for_;  // what ArmTimer asked for while a deadline runs
};

}  // namespace dflash
