// The live runs of this user on this host: what `dflash-launch ps` lists and
// how `ctl RUN_ID` finds a run dir without a config. One small JSON file per
// live supervisor in a directory only the user can write, written by `run` at
// start and removed at its end; an entry whose supervisor is gone (SIGKILLed,
// so it could not remove it) is stale, ignored and removed by whoever reads it.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <string>
#include <vector>

namespace dflash {

struct RunEntry {
  std::string run_id;
  std::string run_dir;     // absolute
  std::string config;      // the run.toml it was started with (absolute), or ""
  pid_t pid = -1;          // the supervisor
  uint64_t start_time = 0; // its /proc start time: a reused pid is not the run
  int64_t started_unix = 0;
};

/// $XDG_RUNTIME_DIR/dflash-launch when XDG_RUNTIME_DIR is set (systemd's
/// per-user dir), else /tmp/dflash-launch-<uid>. With `create`, made 0700.
/// Refused (false, `err` says why and the fix) unless it is a real directory
/// (not a symlink) owned by us and closed to group/others: in /tmp another user
/// could have made it first, to hide our runs or to list their own as ours.
bool RunRegistryDir(bool create, std::string* dir, std::string* err);

/// Registers this process's run; the entry goes when the object does.
class RunRegistration {
 public:
  RunRegistration() = default;
  ~RunRegistration();
  RunRegistration(const RunRegistration&) = delete;
  RunRegistration& operator=(const RunRegistration&) = delete;
  /// Writes the entry (pid and start time are this process's).
  bool Register(RunEntry entry, std::string* err);

 private:
  std::string path_;
};

/// The live runs, oldest first; stale entries are removed. An entry that is
/// not ours or not JSON is skipped. A registry that does not exist is empty.
bool ListRuns(std::vector<RunEntry>* out, std::string* err);

}  // namespace dflash
